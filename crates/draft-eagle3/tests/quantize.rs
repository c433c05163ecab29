//! `quantize-drafter` on an EAGLE-3 head: every mode of the drafter policy
//! writes a head our loader reads packed, whose drafts stay lossless; the
//! vocabulary maps survive; a checkpoint of another architecture is refused
//! naming both.

use std::ops::ControlFlow;

use draft_eagle3::quantize::quantize_head_dir;
use draft_eagle3::{Eagle3Provider, Options};
use serve_loop::{generate, AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::DraftProvider;
use spec_fixtures::eagle3::{GATE, TARGET};
use spec_formats::quantize::drafter::DrafterOptions;
use spec_formats::quantize::QuantizeError;
use spec_models::llama::Model;
use spec_models::{DtypePolicy, LoadOptions};
use spec_runtime::config::{QuantMode, QuantParams};

#[test]
fn every_mode_writes_a_head_that_drafts_losslessly() {
    let root = tempfile::tempdir().expect("tempdir");
    let target_dir = root.path().join("target");
    let head_dir = root.path().join("head");
    std::fs::create_dir_all(&target_dir).expect("mkdir");
    std::fs::create_dir_all(&head_dir).expect("mkdir");
    TARGET.write(&target_dir).expect("target");
    GATE.write(&head_dir).expect("head");
    let target = Model::load(&target_dir, &LoadOptions::default()).expect("load");
    let plain = {
        let request = Request::new(vec![4, 5, 6, 7, 8], 20);
        generate(&target, &[], request, |_| ControlFlow::Continue(()))
            .expect("plain")
            .tokens
    };
    for params in [
        QuantParams::affine(32, 4),
        QuantParams::affine(64, 8),
        QuantMode::Mxfp4.default_params(),
    ] {
        let out = root.path().join(format!("q-{params}"));
        let report = quantize_head_dir(
            &head_dir,
            &out,
            &DrafterOptions {
                params,
                progress: None,
                smoke: None,
            },
        )
        .unwrap_or_else(|e| panic!("{params}: {e}"));
        assert!(
            report.quantized.iter().any(|m| m == "fc"),
            "{:?}",
            report.quantized
        );
        assert!(report.quantized.iter().any(|m| m == "lm_head"));
        let provider = Eagle3Provider::new(
            &target,
            &Options {
                model: out.clone(),
                dtype: DtypePolicy::Keep,
            },
        )
        .unwrap_or_else(|e| panic!("{params}: {e}"));
        let speculation = ProviderChoice::new(
            provider.id(),
            SpecConfig {
                num_draft: 3,
                adaptive: AdaptiveConfig::off(),
                ..SpecConfig::default()
            },
        );
        let request = Request {
            speculation: Some(speculation),
            ..Request::new(vec![4, 5, 6, 7, 8], 20)
        };
        let providers: [&dyn DraftProvider; 1] = [&provider];
        let spec = generate(&target, &providers, request, |_| ControlFlow::Continue(()))
            .expect("speculative");
        assert_eq!(spec.tokens, plain, "{params}");
        assert!(spec.stats.drafted > 0);
    }
}

#[test]
fn another_architecture_is_refused_naming_both() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("llama");
    std::fs::create_dir_all(&dir).expect("mkdir");
    TARGET.write(&dir).expect("target");
    let err = quantize_head_dir(
        &dir,
        &root.path().join("out"),
        &DrafterOptions {
            params: QuantParams::affine(64, 4),
            progress: None,
            smoke: None,
        },
    )
    .expect_err("not a head");
    let text = err.to_string();
    assert!(
        matches!(err, QuantizeError::WrongCheckpoint { .. }),
        "{text}"
    );
    assert!(
        text.contains("LlamaForCausalLMEagle3") && text.contains("LlamaForCausalLM`"),
        "{text}"
    );
}
