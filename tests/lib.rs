//! Helpers of the cross-crate scenarios in `tests/tests/`: locating built
//! binaries, writing tiny random llama and Gemma-4 checkpoints to run
//! requests on (the `spec_fixtures` layouts at test size), greedy runs.

use std::path::{Path, PathBuf};

use spec_fixtures::assistant::{Assistant, Weights};
use spec_fixtures::gemma4;
use spec_fixtures::llama::Llama;

mod failing_target;
pub use failing_target::FailingTarget;

/// `target/<profile>/` of the running test binary (which sits in `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .nth(2)
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Writes a 2-layer llama with random weights (fixed seed) into `dir`: large
/// enough weights that greedy continuations vary, small enough to run fast.
pub fn write_tiny_llama(dir: &Path, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    write_tiny_llama_with(dir, seed, None)
}

/// As `write_tiny_llama`, with the first layer a sliding-window layer of
/// `window` positions when given.
pub fn write_tiny_llama_with(
    dir: &Path,
    seed: u64,
    window: Option<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let layout = Llama {
        sliding_window: window,
        ..Llama::tiny(seed)
    };
    Ok(layout.write(dir)?)
}

/// Which tiny Gemma-4 to write (the gates' variants at test size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gemma4Variant {
    /// `gemma4_text`: sliding and full layers, untied head.
    Text,
    /// The `gemma4` wrapper (tensors under `model.language_model.`) with
    /// KV-shared layers, per-layer inputs, `attention_k_eq_v`, double-wide
    /// MLPs and a tied head.
    Shared,
    /// `gemma4_text` with a mixture-of-experts block on every layer (4
    /// experts, top 2, fused `experts.gate_up_proj` as Hugging Face stores it).
    Moe,
}

/// Writes a tiny random Gemma-4 (fixed seed) with a sliding window of
/// `window` positions into `dir`.
pub fn write_tiny_gemma4(
    dir: &Path,
    seed: u64,
    variant: Gemma4Variant,
    window: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let layout = match variant {
        Gemma4Variant::Text => gemma4::GATE_TEXT,
        Gemma4Variant::Shared => gemma4::GATE_SHARED,
        Gemma4Variant::Moe => gemma4::GATE_MOE,
    };
    Ok(layout.tiny(seed, window).write(dir)?)
}

/// Which output head a tiny Gemma-4 assistant carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssistantHead {
    /// `gemma4_unified_assistant` with the tied head.
    Tied,
    /// `gemma4_assistant` with the centroid head (8 centroids, top 2, an
    /// int64 `token_ordering`).
    Centroid,
}

/// Writes a 4-block Gemma-4 assistant with random weights (fixed seed) for
/// the tiny Gemma-4 targets of [`write_tiny_gemma4`]: backbone `backbone`,
/// vocabulary `vocab`, their head widths and `window`.
pub fn write_tiny_assistant(
    dir: &Path,
    seed: u64,
    head: AssistantHead,
    backbone: i32,
    vocab: i32,
    window: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let layout = Assistant::tiny(
        head == AssistantHead::Centroid,
        seed,
        usize::try_from(backbone)?,
        usize::try_from(vocab)?,
        window,
    );
    Ok(layout.write(dir, Weights::Random)?)
}

/// A greedy request of 20 tokens, speculating with `provider` (3 drafts, no
/// adaptation) when given; `on_token` sees every emitted token.
pub fn greedy_run(
    target: &dyn spec_core::Target,
    prompt: &[u32],
    provider: Option<&dyn spec_core::DraftProvider>,
    on_token: impl FnMut(u32) -> std::ops::ControlFlow<()>,
) -> Result<serve_loop::Output, serve_loop::ServeError> {
    greedy_with(target, prompt, provider, 20, None, on_token)
}

/// [`greedy_run`] of `max_tokens` tokens, from `prefix`'s caches when given.
pub fn greedy_with(
    target: &dyn spec_core::Target,
    prompt: &[u32],
    provider: Option<&dyn spec_core::DraftProvider>,
    max_tokens: usize,
    prefix: Option<spec_core::CacheSet>,
    on_token: impl FnMut(u32) -> std::ops::ControlFlow<()>,
) -> Result<serve_loop::Output, serve_loop::ServeError> {
    use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig};
    let speculation = provider.map(|provider| {
        let config = SpecConfig {
            num_draft: 3,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        };
        ProviderChoice::new(provider.id(), config)
    });
    let request = Request {
        speculation,
        ..Request::new(prompt.to_vec(), max_tokens)
    };
    let config = serve_loop::ScheduleConfig::default();
    let providers = provider.as_slice();
    serve_loop::generate_with(target, providers, request, &config, prefix, on_token)
}

/// A provider whose source reads the target's first layer (as `deepspec`
/// does) and never drafts: what a prefix cache must not hand a saved
/// prefix to.
#[derive(Debug)]
pub struct Tapping;

impl spec_core::DraftProvider for Tapping {
    fn id(&self) -> &str {
        "tapping"
    }

    fn open<'a>(
        &self,
        _: &'a dyn spec_core::Target,
    ) -> Result<Box<dyn spec_core::DraftSource + 'a>, spec_core::SpecError> {
        Ok(Box::new(Tapping))
    }
}

impl spec_core::DraftSource for Tapping {
    fn tap_layers(&self) -> &[usize] {
        &[0]
    }

    fn prefill(
        &mut self,
        _: &[u32],
        _: Option<&mlx_rs::Array>,
    ) -> Result<(), spec_core::SpecError> {
        Ok(())
    }

    fn draft(
        &mut self,
        _: spec_core::DraftRequest<'_>,
        _: &mut dyn spec_core::Sampler,
    ) -> Result<spec_core::Draft, spec_core::SpecError> {
        Ok(spec_core::Draft::default())
    }

    fn commit(&mut self, _: spec_core::CommitInfo<'_>) -> Result<(), spec_core::SpecError> {
        Ok(())
    }
}

/// The tokens of `greedy_run`, which must succeed.
pub fn greedy_tokens(
    target: &dyn spec_core::Target,
    prompt: &[u32],
    provider: Option<&dyn spec_core::DraftProvider>,
) -> Vec<u32> {
    greedy_run(target, prompt, provider, |_| {
        std::ops::ControlFlow::Continue(())
    })
    .expect("generate")
    .tokens
}

/// Whether `counts` (draws per token) fit probabilities `p` by Pearson's
/// chi-square at the 99.9% level: over the tokens `p` expects at least 5
/// times, the rest pooled into one cell (critical value by Wilson-Hilferty).
pub fn chi_square_fits(counts: &[usize], p: &[f64]) -> Result<(), String> {
    let draws: usize = counts.iter().sum();
    let (mut chi, mut cells, mut rest_obs, mut rest_exp) = (0.0, 0u32, 0.0, 0.0);
    for (c, &pi) in counts.iter().zip(p) {
        let e = pi * draws as f64;
        if e >= 5.0 {
            chi += (*c as f64 - e).powi(2) / e;
            cells += 1;
        } else {
            rest_obs += *c as f64;
            rest_exp += e;
        }
    }
    if rest_exp > 0.0 {
        chi += (rest_obs - rest_exp).powi(2) / rest_exp;
        cells += 1;
    } else if rest_obs > 0.0 {
        return Err(format!(
            "{rest_obs} draws of tokens p gives no mass: {counts:?}"
        ));
    }
    let k = f64::from(cells.saturating_sub(1).max(1));
    let z = 3.09;
    let critical = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    if chi < critical {
        Ok(())
    } else {
        Err(format!(
            "chi-square {chi:.1} over {cells} cells exceeds {critical:.1}: {counts:?}"
        ))
    }
}

/// The target's logits at the last position of `prompt`, run from fresh
/// caches: the distribution the first generated token follows (host copy,
/// the last `vocab` values).
pub fn last_logits(target: &dyn spec_core::Target, prompt: &[u32], vocab: usize) -> Vec<f32> {
    let mut caches = target.make_caches();
    let out = target
        .forward(
            &mlx_rs::Array::from_slice(prompt, &[1, prompt.len() as i32]),
            &mut caches,
            &[],
        )
        .expect("forward");
    let logits = target.logits(&out.hidden).expect("logits");
    let row = logits.as_slice::<f32>();
    row[row.len() - vocab..].to_vec()
}

/// A tiny llama that `spec_fixtures`' tiny DSpark drafter fits (hidden 32,
/// 3 layers, vocabulary 64) in `target`, and that drafter in `drafter`.
pub fn write_tiny_deepspec_pair(
    target: &Path,
    drafter: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    Llama {
        hidden: 32,
        layers: 3,
        vocab: 64,
        intermediate: 64,
        tied: false,
        ..Llama::tiny(5000)
    }
    .write(target)?;
    spec_fixtures::dspark::Dspark::tiny().write(drafter)?;
    Ok(())
}

/// A four-layer tiny llama (the template's vocabulary of 96) in `target`,
/// and an EAGLE-3 head drawn for it (draft vocabulary 48) in `head`.
pub fn write_tiny_eagle3_pair(
    target: &Path,
    head: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    Llama {
        layers: 4,
        ..Llama::tiny(6)
    }
    .write(target)?;
    spec_fixtures::eagle3::Eagle3Head {
        vocab: 96,
        draft_vocab: 48,
        ..spec_fixtures::eagle3::GATE
    }
    .write(head)?;
    Ok(())
}
