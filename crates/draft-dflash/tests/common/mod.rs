//! A tiny DFlash checkpoint written on the fly (the `spec_fixtures` layout at
//! test size) and tiny random llama and qwen3 targets of matching dimensions.

#![allow(dead_code, clippy::unwrap_used)]

use std::ops::ControlFlow;
use std::path::Path;

use draft_dflash::{DFlashModel, DFlashProvider};
use mlx_rs::Array;
use serde_json::Value;
use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig, VerifyMode};
use spec_core::{DraftProvider, SamplerConfig, Target};
use spec_fixtures::dflash::Dflash;
use spec_fixtures::llama::Llama;
use spec_models::{load_model, LoadOptions, LoadedModel};

/// The fixture's layout: `spec_fixtures`' DFlash drafter at test size.
pub const LAYOUT: Dflash = Dflash::tiny();
/// DFlash2 whose second layer slides (window 6: longer contexts pass it).
#[allow(dead_code)]
pub const DFLASH2_SLIDING: Dflash = Dflash {
    name: "tiny-dflash2-sliding",
    layers: 2,
    dflash2: Some(spec_fixtures::dflash::SMALL_DFLASH2),
    sliding: Some(spec_fixtures::dflash::Sliding {
        window: 6,
        layers: &[1],
    }),
    ..LAYOUT
};
pub const HIDDEN: i32 = LAYOUT.hidden as i32;
pub const BLOCK: usize = LAYOUT.block_size;
pub const TAPS: i32 = LAYOUT.taps.len() as i32;

/// The fixture, as written, in a fresh temporary directory.
pub fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    LAYOUT.write(dir.path()).unwrap();
    dir
}

/// The fixture with its `config.json` edited by `edit`.
pub fn checkpoint_with(edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = checkpoint();
    let mut config = LAYOUT.config();
    edit(&mut config);
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    dir
}

/// The tiny targets the drafter fits: `llama` (tied) and `qwen3` (untied,
/// q/k norms).
pub fn target_specs() -> [Llama; 2] {
    let llama = Llama::tiny(5000);
    [
        llama,
        Llama {
            name: "tiny-qwen3",
            model_type: "qwen3",
            architecture: "Qwen3ForCausalLM",
            head_dim: Some(32),
            qk_norm: true,
            tied: false,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            ..Llama::tiny(5001)
        },
    ]
}

/// A target written and loaded.
pub fn load_target(spec: &Llama) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    spec.write(dir.path()).unwrap();
    let model = load_model(dir.path(), &LoadOptions::default()).unwrap();
    (dir, model)
}

pub fn load(dir: &Path) -> DFlashModel {
    DFlashModel::load(dir, &LoadOptions::default()).unwrap()
}

/// The tiny llama target and the drafter's provider for it.
pub fn llama_and_provider() -> (tempfile::TempDir, LoadedModel, DFlashProvider) {
    let (dir, model) = load_target(&target_specs()[0]);
    let drafter = checkpoint();
    let provider = DFlashProvider::from_model(load(drafter.path()), &model).unwrap();
    (dir, model, provider)
}

/// Random taps `[1, rows, TAPS * HIDDEN]`.
pub fn taps(rows: i32, seed: u64) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    mlx_rs::random::normal::<f32>(&[1, rows, TAPS * HIDDEN][..], 0.0, 1.0, &key).unwrap()
}

pub const PROMPTS: &[&[u32]] = &[
    &[5],
    &[1, 2, 3, 4, 5, 6],
    &[9, 9, 9, 9, 10, 11, 9, 9, 9],
    &[40, 41, 42, 43, 40, 41, 42, 1, 2],
];

/// 20 tokens of `prompt` through the serve loop: plain without a provider,
/// else speculative with a fixed `num_draft`.
pub fn run(
    target: &dyn Target,
    prompt: &[u32],
    provider: Option<&DFlashProvider>,
    num_draft: usize,
    sampler: SamplerConfig,
    verify: VerifyMode,
) -> serve_loop::Output {
    let config = SpecConfig {
        num_draft,
        verify,
        adaptive: AdaptiveConfig::off(),
        seed: 7,
    };
    let request = Request {
        sampler,
        speculation: provider.map(|p| ProviderChoice::new(p.id(), config)),
        ..Request::new(prompt.to_vec(), 20)
    };
    let providers: Vec<&dyn DraftProvider> = provider
        .map(|p| p as &dyn DraftProvider)
        .into_iter()
        .collect();
    serve_loop::generate(target, &providers, request, |_| ControlFlow::Continue(())).unwrap()
}

/// Greedy `prompt` plainly and with `provider` drafting `num_draft` a
/// round (exact-match verification): `(plain, speculative)`.
pub fn greedy_pair(
    target: &dyn Target,
    prompt: &[u32],
    provider: &DFlashProvider,
    num_draft: usize,
) -> (serve_loop::Output, serve_loop::Output) {
    let greedy = SamplerConfig::default();
    let plain = run(
        target,
        prompt,
        None,
        0,
        greedy.clone(),
        VerifyMode::ExactMatch,
    );
    let spec = run(
        target,
        prompt,
        Some(provider),
        num_draft,
        greedy,
        VerifyMode::ExactMatch,
    );
    (plain, spec)
}
