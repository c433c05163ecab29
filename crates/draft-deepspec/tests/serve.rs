//! `deepspec` driven by the serve loop against a real (tiny, random) llama
//! target: greedy speculative output equals plain output at every threshold,
//! and sampled decoding with rejection sampling runs its rounds to the end.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;

use draft_deepspec::{DSparkModel, DSparkProvider};
use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig, VerifyMode};
use spec_core::{DraftProvider, SamplerConfig, Target};
use spec_models::{load_model, LoadOptions, LoadedModel};

fn target() -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    common::tiny_llama(dir.path());
    let model = load_model(dir.path(), &LoadOptions::default()).unwrap();
    (dir, model)
}

const PROMPTS: &[&[u32]] = &[
    &[5],
    &[1, 2, 3, 4, 5, 6],
    &[9, 9, 9, 9, 10, 11, 9, 9, 9],
    &[40, 41, 42, 43, 40, 41, 42, 1, 2],
];

fn run(
    target: &dyn Target,
    prompt: &[u32],
    provider: Option<&DSparkProvider>,
    sampler: SamplerConfig,
    verify: VerifyMode,
) -> serve_loop::Output {
    let config = SpecConfig {
        num_draft: common::BLOCK,
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

#[test]
fn greedy_speculation_equals_plain_decoding_at_every_threshold() {
    let (_t, model) = target();
    let drafter = common::checkpoint();
    for threshold in [0.0, 0.5, 0.999] {
        let dspark = DSparkModel::load(drafter.path(), &LoadOptions::default()).unwrap();
        let provider = DSparkProvider::from_model(dspark, &model, threshold).unwrap();
        let mut drafted = 0;
        for prompt in PROMPTS {
            let plain = run(
                &model,
                prompt,
                None,
                SamplerConfig::default(),
                VerifyMode::ExactMatch,
            );
            let spec = run(
                &model,
                prompt,
                Some(&provider),
                SamplerConfig::default(),
                VerifyMode::ExactMatch,
            );
            assert_eq!(
                spec.tokens, plain.tokens,
                "threshold {threshold}, prompt {prompt:?}"
            );
            assert_eq!(spec.tokens.len(), 20);
            drafted += spec.stats.drafted;
        }
        if threshold >= 0.999 {
            assert_eq!(
                drafted, 0,
                "a threshold above every confidence proposes nothing"
            );
        } else {
            assert!(drafted > 0, "threshold {threshold} proposed nothing");
        }
    }
}

#[test]
fn sampled_speculation_with_rejection_sampling_runs_to_the_end() {
    let (_t, model) = target();
    let drafter = common::checkpoint();
    let dspark = DSparkModel::load(drafter.path(), &LoadOptions::default()).unwrap();
    let provider = DSparkProvider::from_model(dspark, &model, 0.0).unwrap();
    let sampler = SamplerConfig {
        temperature: 0.8,
        seed: 11,
        ..SamplerConfig::default()
    };
    for prompt in PROMPTS {
        let out = run(
            &model,
            prompt,
            Some(&provider),
            sampler.clone(),
            VerifyMode::Rejection,
        );
        assert_eq!(out.tokens.len(), 20);
        assert!(out.tokens.iter().all(|&t| (t as i32) < common::VOCAB));
        assert!(out.stats.drafted > 0);
        assert!(out.stats.accepted <= out.stats.drafted);
    }
}
