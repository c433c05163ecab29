//! `dflash` driven by the serve loop against real (tiny, random) llama and
//! qwen3 targets: greedy speculative output equals plain output token for
//! token, and sampled decoding with rejection sampling runs to the end.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;

use draft_dflash::DFlashProvider;
use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig, VerifyMode};
use spec_core::{DraftProvider, SamplerConfig, Target};

const PROMPTS: &[&[u32]] = &[
    &[5],
    &[1, 2, 3, 4, 5, 6],
    &[9, 9, 9, 9, 10, 11, 9, 9, 9],
    &[40, 41, 42, 43, 40, 41, 42, 1, 2],
];

fn run(
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

/// Every draft count up to a block, and past it (capped at a block).
#[test]
fn greedy_speculation_equals_plain_decoding_on_llama_and_qwen3() {
    let drafter = common::checkpoint();
    for spec in common::target_specs() {
        let (_t, target) = common::load_target(&spec);
        let provider = DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap();
        for num_draft in [1, 2, common::BLOCK - 1, common::BLOCK + 2] {
            let mut drafted = 0;
            for prompt in PROMPTS {
                let greedy = SamplerConfig::default();
                let plain = run(
                    &target,
                    prompt,
                    None,
                    0,
                    greedy.clone(),
                    VerifyMode::ExactMatch,
                );
                let spec_out = run(
                    &target,
                    prompt,
                    Some(&provider),
                    num_draft,
                    greedy,
                    VerifyMode::ExactMatch,
                );
                assert_eq!(
                    spec_out.tokens, plain.tokens,
                    "{} num_draft {num_draft} prompt {prompt:?}",
                    spec.name
                );
                assert_eq!(spec_out.tokens.len(), 20);
                drafted += spec_out.stats.drafted;
            }
            assert!(drafted > 0, "{} num_draft {num_draft}: no draft", spec.name);
        }
    }
}

#[test]
fn sampled_speculation_with_rejection_sampling_runs_to_the_end() {
    let (_t, target, provider) = common::llama_and_provider();
    let sampler = SamplerConfig {
        temperature: 0.8,
        seed: 11,
        ..SamplerConfig::default()
    };
    for prompt in PROMPTS {
        let out = run(
            &target,
            prompt,
            Some(&provider),
            common::BLOCK - 1,
            sampler.clone(),
            VerifyMode::Rejection,
        );
        assert_eq!(out.tokens.len(), 20);
        assert!(out
            .tokens
            .iter()
            .all(|&t| (t as usize) < common::LAYOUT.vocab));
        assert!(out.stats.drafted > 0);
        assert!(out.stats.accepted <= out.stats.drafted);
    }
}
