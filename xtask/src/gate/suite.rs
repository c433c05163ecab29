//! What the speculative gates (and `bench spec`) share: the prompt suite, the drafter
//! checkpoints, the cases that run every provider (the list is
//! `run_protocol::providers`), and running our `spec_run` example
//! (`crates/mlx-spec/examples/spec_run.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use run_protocol::providers::{self, DRAFT_MODEL, EAGLE3, GEMMA4_ASSISTANT, GLM52_NATIVE_MTP};
use run_protocol::spec::{Prompt, SpecReport, SpecRequest, PLAIN};
use run_protocol::{Dtype, ExpertOptions};
use serde::Deserialize;

use crate::{real_model, runs, shell, venv};
use spec_fixtures::rng::SplitMix64;

/// The prompt suite: input-grounded prompts (code edits, quoting summaries,
/// JSON rewrites) and open-ended ones, plus edits that ask for the edited
/// text back and nothing else (code, JSON, YAML, tables, prose of 40-130
/// tokens): the workload prompt lookup is for.
#[derive(Debug, Deserialize)]
pub struct Suite {
    pub input_grounded: Vec<String>,
    pub open_ended: Vec<String>,
    pub edit_and_return: Vec<String>,
}

pub fn suite() -> Result<Suite> {
    let path = shell::root()
        .join("xtask")
        .join("prompts")
        .join("spec_suite.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Chat prompts for spec_run.
pub fn chat_prompts(texts: &[String]) -> Vec<Prompt> {
    texts.iter().cloned().map(Prompt::Chat).collect()
}

/// Token-id prompts for synthetic models: random ones, and ones that repeat
/// a phrase (so prompt lookup has something to find).
pub fn id_prompts(vocab: u64, count: usize) -> Vec<Vec<u32>> {
    (0..count)
        .map(|i| {
            let mut rng = SplitMix64::keyed(0x5350_4543, &format!("spec prompt {i}"));
            let len = 3 + rng.below(40) as usize;
            let mut ids: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            if i % 2 == 1 {
                let phrase = ids.clone();
                ids.extend(phrase.iter().take(len / 2));
                ids.extend(phrase);
            }
            ids
        })
        .collect()
}

/// Token-id prompts as spec_run's prompts.
pub fn ids(prompts: &[Vec<u32>]) -> Vec<Prompt> {
    prompts.iter().cloned().map(Prompt::Ids).collect()
}

/// The synthetic gate targets the speculative gates run, each with the
/// synthetic checkpoint `draft-model` drafts with on it. Most id prompts run
/// past the sliding window of 8 of the gemma4 targets and `gpt-oss`: their
/// rollbacks happen past the window (no fallback to plain decoding);
/// `gpt-oss` drafts with its own 8-bit copy. The hybrid targets (Gated
/// DeltaNet layers) draft with their own float or 4-bit copy (drafts mostly
/// accepted, some rolled back); the expert-layer one with the other layout.
pub const TARGET_DRAFTS: &[(&str, &str)] = &[
    ("llama3", "llama"),
    ("qwen3", "qwen2"),
    ("qwen3-moe", "qwen3"),
    ("gpt-oss", "gpt-oss-q8g32"),
    ("llama-q4g64", "llama-mixed"),
    ("glm", "glm-q4g64"),
    ("glm-q8g32", "glm-q4g64"),
    ("glm52", "glm52-q4g64"),
    ("glm52-mxfp4", "glm52"),
    ("gemma4-text", "llama"),
    ("gemma4-shared", "qwen2"),
    ("gemma4-moe", "llama"),
    ("qwen3-next", "qwen3-next-q4g32"),
    ("qwen3-5-q4g32", "qwen3-5"),
    ("qwen3-5-moe", "qwen3-next-moe"),
];

/// Provider options (`KEY -> VALUE`) by provider id.
pub type ProviderOptions = BTreeMap<String, BTreeMap<String, String>>;

/// One target a speculative gate runs every provider on.
pub struct Case {
    /// The model's name (the real model's or a synthetic checkpoint's).
    pub label: String,
    pub model: PathBuf,
    pub prompts: Vec<Prompt>,
    /// Provider ids to run: `plain` first, then every provider of
    /// `run_protocol::providers` that applies to the model and has no gate
    /// of its own (`deepspec` needs a DSpark checkpoint made for its target,
    /// `gate dspark` covers it).
    pub providers: Vec<String>,
    /// The options naming the drafters: `draft-model`'s checkpoint, and the
    /// synthetic Gemma-4 assistant (shaped for the synthetic Gemma-4 targets'
    /// widths and vocabulary) on every gemma4 target.
    pub options: ProviderOptions,
    /// Where the target's experts live: resident, or streamed from disk
    /// ([`streamed_case`]).
    pub experts: ExpertOptions,
}

impl Case {
    /// The providers other than `plain`.
    pub fn speculative(&self) -> impl Iterator<Item = &String> {
        self.providers.iter().filter(|p| *p != PLAIN)
    }

    /// Whether the target's routed experts stream from disk.
    pub fn streams(&self) -> bool {
        self.experts.cache_bytes.is_some()
    }

    /// The resident case among `cases` whose output this streamed case must
    /// give (`None`: this case is resident).
    pub fn resident_of<'a>(&self, cases: &'a [Case]) -> Option<&'a Case> {
        if !self.streams() {
            return None;
        }
        cases.iter().find(|c| c.model == self.model && !c.streams())
    }

    /// Every provider on `prompts` (the model's weights as stored, each
    /// provider's default draft count, greedy).
    pub fn request(&self, prompts: Vec<Prompt>, max_tokens: usize) -> SpecRequest {
        SpecRequest {
            options: self.options.clone(),
            experts: self.experts,
            ..SpecRequest::new(
                self.model.clone(),
                Dtype::Keep,
                prompts,
                max_tokens,
                self.providers.clone(),
            )
        }
    }
}

/// `plain`, then every provider the every-provider gates run on `model`.
pub fn providers_for(model: &str) -> Vec<String> {
    std::iter::once(PLAIN)
        .chain(providers::for_model(model))
        .map(str::to_owned)
        .collect()
}

/// The cases of the gates that run every provider on every gate model: the
/// real model on `real_texts` as chat prompts (its drafter a 4-bit copy of
/// it), then each of [`TARGET_DRAFTS`] on `synthetic_prompts` token-id
/// prompts. Builds the runner and makes the checkpoints it lacks.
pub fn provider_cases(
    python: &Path,
    real_texts: &[String],
    synthetic_prompts: usize,
) -> Result<Vec<Case>> {
    let mut synthetic = crate::synth::ensure_with_assistants(python)?;
    synthetic.extend(crate::synth_qwen3_next::ensure(
        &crate::synth::models_dir(),
        python,
    )?);
    build_runner()?;
    let dir_of = |name: &str| -> Result<PathBuf> {
        synthetic
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("no synthetic {name} checkpoint"))
    };
    let assistant = dir_of("gemma4-assistant")?;
    let case = |label: &str, model: PathBuf, prompts: Vec<Prompt>, drafter: &Path| {
        let mut options = ProviderOptions::new();
        let mut set = |id: &str, key: &str, value: &Path| {
            options
                .entry(id.to_owned())
                .or_default()
                .insert(key.to_owned(), value.display().to_string());
        };
        set(DRAFT_MODEL, "model", drafter);
        if label.starts_with("gemma4") {
            set(GEMMA4_ASSISTANT, "model", &assistant);
        }
        Case {
            label: label.to_owned(),
            model,
            prompts,
            providers: providers_for(label),
            options,
            experts: ExpertOptions::default(),
        }
    };
    let mut cases = vec![case(
        real_model::NAME,
        real_model::ensure()?,
        chat_prompts(real_texts),
        &real_drafter(python)?,
    )];
    for &(target, draft) in TARGET_DRAFTS {
        cases.push(case(
            target,
            dir_of(target)?,
            ids(&id_prompts(320, synthetic_prompts)),
            &dir_of(draft)?,
        ));
    }
    // `eagle3` on the four-layer llama its synthetic head was drawn for (the
    // other providers run on the gate llama already).
    let (target, heads) = crate::synth_eagle3::ensure()?;
    let head = heads
        .first()
        .map(|(_, dir)| dir.display().to_string())
        .context("no synthetic EAGLE-3 head")?;
    cases.push(Case {
        label: spec_fixtures::eagle3::TARGET.name.to_owned(),
        model: target,
        prompts: ids(&id_prompts(320, synthetic_prompts)),
        providers: vec![PLAIN.to_owned(), EAGLE3.to_owned()],
        options: ProviderOptions::from([(
            EAGLE3.to_owned(),
            BTreeMap::from([("model".to_owned(), head)]),
        )]),
        experts: ExpertOptions::default(),
    });
    Ok(cases)
}

/// The synthetic target the streamed-expert cases run on: GLM-5.2's schema
/// (`Glm::glm52_gate()`), four expert layers of eight experts.
pub const STREAMED_TARGET: &str = "glm52";

/// The case of [`STREAMED_TARGET`] among `cases` again, its routed experts
/// streamed from disk through a tier of one layer's experts (so they exceed
/// it as many times over as there are expert layers), on its first
/// `prompts` prompts, running `providers` (`glm52-native-mtp` with the MTP
/// row's experts at 8 bits); labelled `LABEL+streamed`. Its plain output
/// must equal the resident case's ([`Case::resident_of`]).
pub fn streamed_case(cases: &[Case], prompts: usize, providers: &[&str]) -> Result<Case> {
    let resident = cases
        .iter()
        .find(|c| c.label == STREAMED_TARGET && !c.streams())
        .with_context(|| format!("no {STREAMED_TARGET} case"))?;
    let routed = crate::synth_glm::routed_experts(&resident.model)?;
    let tier = routed.layer_bytes();
    eprintln!(
        "streamed: {STREAMED_TARGET}'s routed experts {} bytes in {} layers, tier {tier} bytes (one layer's): {:.1}x the tier",
        routed.bytes,
        routed.layers,
        routed.bytes as f64 / tier as f64
    );
    Ok(Case {
        label: format!("{}+streamed", resident.label),
        model: resident.model.clone(),
        prompts: resident.prompts.iter().take(prompts).cloned().collect(),
        providers: providers.iter().map(|&p| p.to_owned()).collect(),
        options: resident.options.clone(),
        experts: ExpertOptions {
            cache_bytes: Some(usize::try_from(tier)?),
            mtp_expert_bits: providers.contains(&GLM52_NATIVE_MTP).then_some(8),
        },
    })
}

/// A 4-bit (group 64) copy of the real model, made by mlx-lm's own
/// quantizer: a drafter of the same vocabulary that disagrees with the
/// target often enough to exercise rejection and rollback.
pub fn real_drafter(python: &Path) -> Result<PathBuf> {
    let target = real_model::ensure()?;
    let dir = target.with_file_name("smollm2-135m-q4-drafter");
    let quantize = ["-q", "--q-bits", "4", "--q-group-size", "64"];
    converted(python, &target, &dir, &quantize).context("making the drafter")?;
    Ok(dir)
}

/// [`real_drafter`] dequantized to float32 by mlx-lm (`convert -d`): the
/// same drafter's values, run through float matmuls (the 4-bit ones of
/// MLX's CPU backend are about six times slower here).
pub fn real_float_drafter(python: &Path) -> Result<PathBuf> {
    let quantized = real_drafter(python)?;
    let dir = quantized.with_file_name("smollm2-135m-q4-drafter-f32");
    converted(python, &quantized, &dir, &["-d"]).context("dequantizing the drafter")?;
    Ok(dir)
}

/// Writes `dir` with `mlx_lm convert` from `source` with `args`, unless a
/// finished copy is there (a partial one is removed first).
fn converted(python: &Path, source: &Path, dir: &Path, args: &[&str]) -> Result<()> {
    if dir.join("config.json").exists() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    shell::run(
        venv::python_command(python)
            .args(["-m", "mlx_lm", "convert", "--hf-path"])
            .arg(source)
            .arg("--mlx-path")
            .arg(dir)
            .args(args),
    )
    .context("mlx_lm convert failed")
}

pub fn build_runner() -> Result<()> {
    shell::build()
}

/// Runs spec_run on `request` (request and report saved as
/// `WORK/LABEL.request.json` and `WORK/LABEL.json`) under `env` (e.g.
/// `OPENBLAS_NUM_THREADS`).
pub fn spec_run(
    request: &SpecRequest,
    work: &Path,
    label: &str,
    env: &[(&str, &str)],
) -> Result<SpecReport> {
    runs::example(request, &work.join(label), env)
}

/// A run's environment (`OPENBLAS_NUM_THREADS`, say).
pub type Env = &'static [(&'static str, &'static str)];

/// Runs each `(label, request, env)` through spec_run (saved under `work`
/// by label, `/` made `-`), side by side, the real model's first (the
/// longest: started last, they would run alone at the end); their reports
/// in the order given, or the first failure.
pub fn spec_runs(runs: Vec<(String, SpecRequest, Env)>, work: &Path) -> Result<Vec<SpecReport>> {
    let jobs = runs
        .into_iter()
        .map(|(label, request, env)| {
            let long = label.starts_with(crate::real_model::NAME);
            let job: runs::Job<SpecReport> =
                Box::new(move || spec_run(&request, work, &label.replace('/', "-"), env));
            (long, job)
        })
        .collect();
    runs::parallel_long_first(jobs)?.into_iter().collect()
}
