//! `dflash` driven by the serve loop against real (tiny, random) llama and
//! qwen3 targets: greedy speculative output equals plain output token for
//! token, and sampled decoding with rejection sampling runs to the end.

#![allow(clippy::unwrap_used)]

mod common;

use common::{run, PROMPTS};
use draft_dflash::DFlashProvider;
use serve_loop::VerifyMode;
use spec_core::SamplerConfig;

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

/// A vocabulary of 6: random drafts agree with the target often enough that
/// rounds accept some drafts and reject the rest (the rollback's partial
/// case), still equal to plain decoding.
#[test]
fn greedy_speculation_with_accepted_drafts_equals_plain_decoding() {
    let vocab = 6;
    let drafter = tempfile::tempdir().unwrap();
    spec_fixtures::dflash::Dflash {
        vocab,
        ..common::LAYOUT
    }
    .write(drafter.path())
    .unwrap();
    let (mut drafted, mut accepted) = (0, 0);
    for spec in common::target_specs() {
        let (_t, target) = common::load_target(&spec_fixtures::llama::Llama { vocab, ..spec });
        let provider = DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap();
        for prompt in [&[1u32][..], &[0, 1, 2, 3, 4, 5], &[5, 5, 4, 2]] {
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
                common::BLOCK - 1,
                greedy,
                VerifyMode::ExactMatch,
            );
            assert_eq!(spec_out.tokens, plain.tokens, "{} {prompt:?}", spec.name);
            drafted += spec_out.stats.drafted;
            accepted += spec_out.stats.accepted;
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "{accepted} of {drafted} accepted"
    );
}
