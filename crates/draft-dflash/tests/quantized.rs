//! A DFlash drafter quantized by `spec_formats::quantize` (mlx-lm's layout:
//! every projection packed, norms kept) loads, dequantized to float32 or kept
//! packed, holds fewer bytes, and stays lossless against the llama target.

#![allow(clippy::unwrap_used)]

mod common;

use common::{run, PROMPTS};
use draft_dflash::{DFlashModel, DFlashProvider};
use mlx_ext::quant::QuantParams;
use serve_loop::VerifyMode;
use spec_core::SamplerConfig;
use spec_formats::quantize::{quantize_dir, QuantizeOptions};
use spec_runtime::{DtypePolicy, LoadOptions};

#[test]
fn a_quantized_drafter_loads_and_stays_lossless() {
    let src = common::checkpoint();
    let (_t, target) = common::load_target(&common::target_specs()[0]);
    let float_bytes = common::load(src.path()).weights_bytes();
    let root = tempfile::tempdir().unwrap();
    for (bits, group) in [(4, 32), (8, 64)] {
        let out = root.path().join(format!("q{bits}g{group}"));
        let report = quantize_dir(
            src.path(),
            &out,
            &QuantizeOptions::new(QuantParams::affine(group, bits)),
        )
        .unwrap();
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
                let greedy = SamplerConfig::default();
                let plain = run(
                    &target,
                    prompt,
                    None,
                    0,
                    greedy.clone(),
                    VerifyMode::ExactMatch,
                );
                let spec = run(
                    &target,
                    prompt,
                    Some(&provider),
                    common::BLOCK - 1,
                    greedy,
                    VerifyMode::ExactMatch,
                );
                assert_eq!(spec.tokens, plain.tokens, "q{bits}g{group} {prompt:?}");
                drafted += spec.stats.drafted;
            }
            assert!(drafted > 0);
        }
    }
}
