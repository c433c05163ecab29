//! DFlash2 (grouped dynamic causal convolutions, candidate selector) and
//! sliding drafter layers on the tiny targets: lossless through the serve
//! loop, the selector's chain is not the per-position argmax, sampled
//! drafts carry their distribution over the candidates only, and a sliding
//! layer ignores the context outside its window.

#![allow(clippy::unwrap_used)]

mod common;

use common::{run, PROMPTS};
use draft_dflash::{DFlashModel, DFlashProvider};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use serve_loop::VerifyMode;
use spec_core::{GreedySampler, SamplerConfig};
use spec_fixtures::dflash::{Dflash, Sliding, SMALL_DFLASH2};
use spec_runtime::tap_context::TapContext;

const DFLASH2: Dflash = Dflash {
    name: "tiny-dflash2",
    layers: 2,
    dflash2: Some(SMALL_DFLASH2),
    ..common::LAYOUT
};

/// One full and one sliding layer, window 6.
const SLIDING: Dflash = Dflash {
    name: "tiny-dflash-sliding",
    layers: 2,
    sliding: Some(Sliding {
        window: 6,
        layers: &[1],
    }),
    ..common::LAYOUT
};

fn written(spec: &Dflash) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    spec.write(dir.path()).unwrap();
    dir
}

fn context(model: &DFlashModel, rows: i32, seed: u64) -> TapContext {
    let mut ctx = TapContext::default();
    model
        .extend_context(&mut ctx, &common::taps(rows, seed))
        .unwrap();
    ctx
}

/// Greedy output equals plain output for DFlash2, sliding layers and both
/// together, at the fixture's vocabulary and at 6 (drafts accepted).
#[test]
fn greedy_speculation_equals_plain_decoding() {
    let both = Dflash {
        dflash2: Some(SMALL_DFLASH2),
        ..SLIDING
    };
    let (mut drafted, mut accepted) = (0, 0);
    for spec in [DFLASH2, SLIDING, both] {
        for vocab in [common::LAYOUT.vocab, 6] {
            let dflash2 = spec.dflash2.map(|d| d.selector_top_k.min(vocab));
            let spec = Dflash {
                vocab,
                mask_token: common::LAYOUT.mask_token.min(vocab - 1),
                dflash2: spec.dflash2.map(|d| spec_fixtures::dflash::Dflash2 {
                    selector_top_k: dflash2.unwrap_or(d.selector_top_k),
                    ..d
                }),
                ..spec
            };
            let drafter = written(&spec);
            let target_spec = spec_fixtures::llama::Llama {
                vocab,
                ..common::target_specs()[0]
            };
            let (_t, target) = common::load_target(&target_spec);
            let provider =
                DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap();
            for prompt in PROMPTS {
                let prompt: Vec<u32> = prompt.iter().map(|&t| t % vocab as u32).collect();
                let (plain, out) =
                    common::greedy_pair(&target, &prompt, &provider, common::BLOCK - 1);
                assert_eq!(out.tokens, plain.tokens, "{} {prompt:?}", spec.name);
                drafted += out.stats.drafted;
                accepted += out.stats.accepted;
            }
        }
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "{accepted} of {drafted} accepted"
    );
}

/// The selector chains its choices: on some block a draft is not the
/// argmax of its position's logits (else the selector would be untested).
#[test]
fn the_selector_overturns_the_logits_on_some_position() {
    let drafter = written(&DFLASH2);
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let model = common::load(drafter.path());
    let mut differs = 0;
    for seed in 0..8 {
        let ctx = context(&model, 5, seed);
        let anchor = seed as u32 * 7;
        let proposal = model
            .propose(&target, &ctx, anchor, common::BLOCK, &mut GreedySampler)
            .unwrap();
        let logits = model
            .block_logits(&target, &ctx, anchor, common::BLOCK)
            .unwrap();
        let argmax = argmax_axis(logits.index((0, .., ..)), -1, false).unwrap();
        differs += usize::from(argmax.as_slice::<u32>() != proposal.tokens.as_slice());
    }
    assert!(differs > 0, "every chain was the per-position argmax");
}

/// A sampled draft's distribution lives on its position's candidates:
/// `selector_top_k` tokens with positive probability, summing to 1, the
/// drawn token among them; sampled speculation runs to the end.
#[test]
fn sampled_drafts_draw_from_the_candidates() {
    let drafter = written(&DFLASH2);
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let model = common::load(drafter.path());
    let config = SamplerConfig {
        temperature: 0.8,
        seed: 3,
        ..SamplerConfig::default()
    };
    let mut sampler = config.build(common::LAYOUT.vocab).unwrap();
    let ctx = context(&model, 4, 1);
    let proposal = model
        .propose(&target, &ctx, 9, common::BLOCK, sampler.as_mut())
        .unwrap();
    for (lp, &token) in proposal.logprobs.iter().zip(&proposal.tokens) {
        let p = sampler.probabilities(lp).unwrap();
        p.eval().unwrap();
        let p = p.as_slice::<f32>();
        let support = p.iter().filter(|&&x| x > 0.0).count();
        assert_eq!(support, SMALL_DFLASH2.selector_top_k);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(
            p[token as usize] > 0.0,
            "token {token} outside the candidates"
        );
    }
    let provider = DFlashProvider::from_model(model, &target).unwrap();
    for prompt in PROMPTS {
        let out = run(
            &target,
            prompt,
            Some(&provider),
            common::BLOCK - 1,
            config.clone(),
            VerifyMode::Rejection,
        );
        assert_eq!(out.tokens.len(), 20);
        assert!(out.stats.drafted > 0);
    }
}

/// Past the window, a sliding layer's drafts do not depend on context rows
/// `sliding_window - 1` or more positions back... but do on the newer ones
/// (a full layer would see every change).
#[test]
fn a_sliding_layer_ignores_the_context_outside_its_window() {
    let all_sliding = Dflash {
        sliding: Some(Sliding {
            window: 6,
            layers: &[0, 1],
        }),
        ..SLIDING
    };
    let drafter = written(&all_sliding);
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let model = common::load(drafter.path());
    let (rows, keep) = (12, 5);
    let base = common::taps(rows, 4);
    let other = common::taps(rows, 5);
    let logits = |taps: &Array| {
        let mut ctx = TapContext::default();
        model.extend_context(&mut ctx, taps).unwrap();
        let l = model.block_logits(&target, &ctx, 2, common::BLOCK).unwrap();
        l.eval().unwrap();
        l.as_slice::<f32>().to_vec()
    };
    let splice = |old: i32| {
        mlx_rs::ops::concatenate(
            &[other.index((.., ..old, ..)), base.index((.., old.., ..))],
            1,
        )
        .unwrap()
    };
    let reference = logits(&base);
    assert_eq!(
        logits(&splice(rows - keep)),
        reference,
        "old rows leaked in"
    );
    assert_ne!(
        logits(&splice(rows - keep + 1)),
        reference,
        "the window's rows"
    );
}

/// A missing or misshapen convolution or selector tensor is refused at
/// load, naming it.
#[test]
fn missing_or_misshapen_dflash2_tensors_are_refused_naming_them() {
    let dir = written(&DFLASH2);
    let path = dir.path().join("model.safetensors");
    let original = spec_runtime::weights::load_file(&path).unwrap();
    mlx_rs::transforms::eval(original.values()).unwrap();
    let wrong = Array::zeros::<f32>(&[3, 3]).unwrap();
    for (name, replacement) in [
        ("layers.1.mlp_conv.kernel_projection.weight", None),
        ("layers.0.attention_conv.base_kernel", Some(&wrong)),
        ("candidate_selector.successor_codebook", Some(&wrong)),
        ("candidate_selector.hidden_projection.weight", None),
    ] {
        let mut tensors = original.clone();
        match replacement {
            Some(a) => tensors.insert(name.to_owned(), a.clone()),
            None => tensors.remove(name),
        };
        Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, &path).unwrap();
        let e = DFlashModel::load(dir.path(), &Default::default()).unwrap_err();
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
}
