//! A DFlash drafter quantized by its `quantize-drafter` policy (mlx-lm's
//! layout: every projection packed, norms kept; the reload smoke test run)
//! loads, dequantized to float32 or kept packed, holds fewer bytes, and stays
//! lossless against the llama target; other checkpoints and parameters the
//! policy does not offer are refused.

#![allow(clippy::unwrap_used)]

mod common;

use common::PROMPTS;
use draft_dflash::quantize::{quantize_drafter_dir, smoke};
use draft_dflash::{DFlashModel, DFlashProvider};
use mlx_ext::quant::QuantParams;
use spec_formats::quantize::drafter::DrafterOptions;
use spec_formats::quantize::QuantizeError;
use spec_runtime::{DtypePolicy, LoadOptions};

#[test]
fn a_quantized_drafter_loads_and_stays_lossless() {
    let src = common::checkpoint();
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let float_bytes = common::load(src.path()).weights_bytes();
    let root = tempfile::tempdir().unwrap();
    for (bits, group) in [(4, 32), (8, 64)] {
        let out = root.path().join(format!("q{bits}g{group}"));
        let options = DrafterOptions {
            params: QuantParams::affine(group, bits),
            progress: None,
            smoke: Some(smoke()),
        };
        let report = quantize_drafter_dir(src.path(), &out, &options).unwrap();
        assert!(report.quantized.len() >= 8, "{:?}", report.quantized);
        let kept = DFlashModel::load(
            &out,
            &LoadOptions {
                dtype: DtypePolicy::Keep,
                ..LoadOptions::default()
            },
        )
        .unwrap();
        assert!(
            kept.weights_bytes() < float_bytes,
            "packed {} vs float {float_bytes}",
            kept.weights_bytes()
        );
        assert!(!kept.config().quantization.is_empty());
        for model in [kept, common::load(&out)] {
            let provider = DFlashProvider::from_model(model, &target).unwrap();
            let mut drafted = 0;
            for prompt in PROMPTS {
                let (plain, spec) =
                    common::greedy_pair(&target, prompt, &provider, common::BLOCK - 1);
                assert_eq!(spec.tokens, plain.tokens, "q{bits}g{group} {prompt:?}");
                drafted += spec.stats.drafted;
            }
            assert!(drafted > 0);
        }
    }
}

#[test]
fn the_policy_refuses_other_checkpoints_and_parameters() {
    let root = tempfile::tempdir().unwrap();
    let options = |params| DrafterOptions {
        params,
        progress: None,
        smoke: Some(smoke()),
    };
    let target = root.path().join("llama");
    std::fs::create_dir_all(&target).unwrap();
    common::target_specs()[0].write(&target).unwrap();
    let err = quantize_drafter_dir(
        &target,
        &root.path().join("a"),
        &options(QuantParams::affine(32, 4)),
    )
    .unwrap_err();
    assert!(
        matches!(err, QuantizeError::WrongCheckpoint { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("DFlashDraftModel"), "{err}");
    let src = common::checkpoint();
    let err = quantize_drafter_dir(
        src.path(),
        &root.path().join("b"),
        &options(QuantParams::affine(128, 4)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("32|64"), "{err}");
    // The smoke test reloads what was written: a config the drafter refuses
    // fails it.
    let bad = common::checkpoint_with(|c| c["hidden_act"] = serde_json::json!("gelu"));
    let err = quantize_drafter_dir(
        bad.path(),
        &root.path().join("c"),
        &options(QuantParams::affine(32, 4)),
    )
    .unwrap_err();
    assert!(
        matches!(&err, QuantizeError::Smoke { message, .. } if message.contains("hidden_act")),
        "{err}"
    );
}

/// DFlash2 with a sliding layer: the convolutions' `kernel_projection`
/// packed, the selector's `hidden_projection` excluded, codebooks and base
/// kernels kept float; it loads packed and dequantized and stays lossless.
#[test]
fn a_quantized_dflash2_drafter_keeps_its_selector_float() {
    use spec_fixtures::dflash::{Dflash, Sliding, SMALL_DFLASH2};
    let src = tempfile::tempdir().unwrap();
    Dflash {
        layers: 2,
        dflash2: Some(SMALL_DFLASH2),
        sliding: Some(Sliding {
            window: 6,
            layers: &[1],
        }),
        ..common::LAYOUT
    }
    .write(src.path())
    .unwrap();
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("q4");
    let options = DrafterOptions {
        params: QuantParams::affine(32, 4),
        progress: None,
        smoke: Some(smoke()),
    };
    let report = quantize_drafter_dir(src.path(), &out, &options).unwrap();
    assert!(report
        .quantized
        .contains(&"layers.1.mlp_conv.kernel_projection".to_owned()));
    assert_eq!(
        report.excluded,
        vec!["candidate_selector.hidden_projection"]
    );
    assert!(report.quantized.iter().all(|m| !m.contains("codebook")));
    let stored = spec_runtime::weights::load_file(&out.join("model.safetensors")).unwrap();
    for float in [
        "candidate_selector.predecessor_codebook",
        "layers.0.attention_conv.base_kernel",
        "candidate_selector.hidden_projection.weight",
    ] {
        assert_eq!(stored[float].dtype(), mlx_rs::Dtype::Float32, "{float}");
    }
    let keep = LoadOptions {
        dtype: DtypePolicy::Keep,
        ..LoadOptions::default()
    };
    for model in [DFlashModel::load(&out, &keep).unwrap(), common::load(&out)] {
        let provider = DFlashProvider::from_model(model, &target).unwrap();
        for prompt in PROMPTS {
            let (plain, spec) = common::greedy_pair(&target, prompt, &provider, common::BLOCK - 1);
            assert_eq!(spec.tokens, plain.tokens, "{prompt:?}");
        }
    }
}
