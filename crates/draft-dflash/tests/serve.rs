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
                let (plain, spec_out) = common::greedy_pair(&target, prompt, &provider, num_draft);
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
            let (plain, spec_out) =
                common::greedy_pair(&target, prompt, &provider, common::BLOCK - 1);
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

/// The hybrid targets (Gated DeltaNet layers beside attention, recurrent
/// states rolled back by the serve loop), as `qwen3_next` and as the
/// `qwen3_5` multimodal checkpoint: a drafter tapping a linear and a full
/// layer stays lossless; at a vocabulary of 6 some drafts are accepted (a
/// recurrent state kept for part of a verify window).
#[test]
fn greedy_speculation_equals_plain_decoding_on_hybrid_targets() {
    use spec_fixtures::qwen3_next::{Qwen3Next, GATE, GATE_QWEN3_5};
    let (mut drafted, mut accepted) = (0, 0);
    for vocab in [common::LAYOUT.vocab, 6] {
        let drafter = tempfile::tempdir().unwrap();
        spec_fixtures::dflash::Dflash {
            taps: &[1, 3],
            target_layers: GATE.layers,
            vocab,
            ..common::LAYOUT
        }
        .write(drafter.path())
        .unwrap();
        for spec in [GATE.tiny(6000), GATE_QWEN3_5.tiny(6001)] {
            let spec = Qwen3Next { vocab, ..spec };
            let dir = tempfile::tempdir().unwrap();
            spec.write(dir.path()).unwrap();
            let target =
                spec_models::load_model(dir.path(), &spec_models::LoadOptions::default()).unwrap();
            let provider =
                DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap();
            for prompt in PROMPTS {
                let prompt: Vec<u32> = prompt.iter().map(|&t| t % vocab as u32).collect();
                let (plain, spec_out) =
                    common::greedy_pair(&target, &prompt, &provider, common::BLOCK - 1);
                assert_eq!(
                    spec_out.tokens, plain.tokens,
                    "{} vocab {vocab} {prompt:?}",
                    spec.name
                );
                drafted += spec_out.stats.drafted;
                accepted += spec_out.stats.accepted;
            }
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "{accepted} of {drafted} accepted"
    );
}
