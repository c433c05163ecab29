//! The DSpark drafter policy (`draft_deepspec::quantize`) on `spec_fixtures`' DSpark
//! drafter (the real tensor names): what is quantized (gather tables
//! included), what stays full precision and is recorded `false`, the smoke
//! hook, and the refusals.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use draft_deepspec::quantize::{quantize_drafter_dir, DrafterOptions, DSPARK_ARCHITECTURE};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};
use spec_fixtures::dspark::Dspark;
use spec_formats::quantize::QuantizeError;
use spec_runtime::config::{QuantMode, QuantParams};

/// The source: `spec_fixtures`' tiny DSpark drafter at hidden 64 and Markov
/// rank 64, so that group 64 divides the gather tables (`embed_tokens`,
/// `markov_head.*`) too.
const SPEC: Dspark = Dspark {
    name: "quantize-drafter",
    hidden: 64,
    markov_rank: 64,
    ..Dspark::tiny()
};

/// Writes the fixture and a tokenizer into `root/name` and returns the
/// directory.
fn source(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    SPEC.write(&dir).expect("fixture");
    std::fs::write(dir.join("tokenizer.json"), "{}").expect("tokenizer");
    dir
}

/// The tensors of a source as written.
fn tensors(dir: &Path) -> HashMap<String, Array> {
    Array::load_safetensors(dir.join("model.safetensors")).expect("weights")
}

fn options(bits: i32, group_size: i32) -> DrafterOptions {
    DrafterOptions {
        params: QuantParams::affine(group_size, bits),
        progress: None,
        smoke: None,
    }
}

fn bits_of(a: &Array) -> Vec<u32> {
    a.eval().expect("eval");
    match a.dtype() {
        Dtype::Float32 => a.as_slice::<f32>().iter().map(|x| x.to_bits()).collect(),
        Dtype::Uint32 => a.as_slice::<u32>().to_vec(),
        other => panic!("unexpected dtype {other:?}"),
    }
}

#[test]
fn every_divisible_weight_is_quantized_but_the_confidence_head() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = source(root.path(), "src");
    let source_tensors = tensors(&src);
    for (bits, group_size) in [(4, 32), (4, 64), (8, 32), (8, 64)] {
        let out = root.path().join(format!("q{bits}g{group_size}"));
        let report =
            quantize_drafter_dir(&src, &out, &options(bits, group_size)).expect("quantize");
        let written = Array::load_safetensors(out.join("model.safetensors")).expect("output");
        let mut expected_quantized: Vec<String> = source_tensors
            .iter()
            .filter(|(n, a)| {
                n.ends_with(".weight")
                    && a.ndim() == 2
                    && !n.starts_with("confidence_head")
                    && a.shape()[1] % group_size == 0
            })
            .map(|(n, _)| n.trim_end_matches(".weight").to_owned())
            .collect();
        expected_quantized.sort();
        // The gather tables are among them.
        assert!(expected_quantized.contains(&"embed_tokens".to_owned()));
        assert!(expected_quantized.contains(&"markov_head.markov_w1".to_owned()));
        assert_eq!(
            report.quantized, expected_quantized,
            "{bits} bits, group {group_size}"
        );
        for module in &expected_quantized {
            let w = &source_tensors[&format!("{module}.weight")];
            let (wq, scales, biases) =
                mlx_rs::ops::quantize(w, group_size, bits).expect("quantize");
            assert_eq!(
                bits_of(&written[&format!("{module}.weight")]),
                bits_of(&wq),
                "{module}"
            );
            assert_eq!(
                bits_of(&written[&format!("{module}.scales")]),
                bits_of(&scales),
                "{module}"
            );
            assert_eq!(
                bits_of(&written[&format!("{module}.biases")]),
                bits_of(&biases),
                "{module}"
            );
        }
        for name in [
            "confidence_head.proj.weight",
            "confidence_head.proj.bias",
            "norm.weight",
            "layers.0.layer_scalar",
        ] {
            assert_eq!(
                bits_of(&written[name]),
                bits_of(&source_tensors[name]),
                "{name} stays full precision"
            );
        }
        assert!(!written.contains_key("confidence_head.proj.scales"));
        assert_eq!(report.excluded, ["confidence_head.proj"]);
        let cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("config.json")).expect("config"),
        )
        .expect("json");
        let block = json!({"group_size": group_size, "bits": bits, "mode": "affine", "confidence_head.proj": false});
        assert_eq!(cfg["quantization"], block);
        assert_eq!(cfg["quantization_config"], block);
        assert_eq!(cfg["architectures"][0], DSPARK_ARCHITECTURE);
        assert!(out.join("tokenizer.json").exists());
    }
}

/// The floating-point modes: the same modules, packed without biases,
/// uint8 scales, the mode in the block.
#[test]
fn floating_point_modes_quantize_the_same_modules_without_biases() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = source(root.path(), "src");
    for mode in [QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8] {
        let params = mode.default_params();
        let out = root.path().join(mode.as_str());
        let report = quantize_drafter_dir(
            &src,
            &out,
            &DrafterOptions {
                params,
                ..options(4, 32)
            },
        )
        .expect("quantize");
        let written = Array::load_safetensors(out.join("model.safetensors")).expect("output");
        assert!(
            report.quantized.contains(&"embed_tokens".to_owned()),
            "{mode}"
        );
        for module in &report.quantized {
            assert_eq!(
                written[&format!("{module}.scales")].dtype(),
                Dtype::Uint8,
                "{module}"
            );
            assert!(
                !written.contains_key(&format!("{module}.biases")),
                "{module}"
            );
        }
        let cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("config.json")).expect("config"),
        )
        .expect("json");
        let block = json!({"group_size": params.group_size, "bits": params.bits,
            "mode": mode.as_str(), "confidence_head.proj": false});
        assert_eq!(cfg["quantization"], block);
    }
}

#[test]
fn the_smoke_test_sees_the_written_output_and_its_failure_is_reported() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = source(root.path(), "src");
    let seen: Arc<Mutex<Vec<(PathBuf, bool)>>> = Arc::default();
    let log = seen.clone();
    let passing = DrafterOptions {
        smoke: Some(Arc::new(move |dir: &Path| {
            let quantized = Array::load_safetensors(dir.join("model.safetensors"))
                .map_err(|e| e.to_string())?
                .contains_key("fc.scales");
            log.lock()
                .expect("lock")
                .push((dir.to_path_buf(), quantized));
            Ok(())
        })),
        ..options(4, 32)
    };
    let out = root.path().join("out");
    quantize_drafter_dir(&src, &out, &passing).expect("quantize");
    assert_eq!(*seen.lock().expect("lock"), [(out.clone(), true)]);

    let failing = DrafterOptions {
        smoke: Some(Arc::new(|_: &Path| {
            Err("project_context gave [1, 1, 7]".to_owned())
        })),
        ..options(8, 64)
    };
    let out2 = root.path().join("out2");
    let err = quantize_drafter_dir(&src, &out2, &failing).expect_err("smoke fails");
    assert!(
        matches!(&err, QuantizeError::Smoke { message, .. } if message.contains("[1, 1, 7]")),
        "{err}"
    );
}

#[test]
fn refusals_name_the_problem() {
    let root = tempfile::tempdir().expect("tempdir");
    // The fixture claiming to be a target model.
    let target = source(root.path(), "target");
    let mut config = SPEC.config();
    config["architectures"] = json!(["LlamaForCausalLM"]);
    spec_fixtures::write_config(&target, &config).expect("config");
    let err = quantize_drafter_dir(&target, &root.path().join("a"), &options(4, 64))
        .expect_err("not DSpark");
    let text = err.to_string();
    assert!(
        matches!(err, QuantizeError::WrongCheckpoint { .. }),
        "{text}"
    );
    assert!(
        text.contains("mlx-spec quantize")
            && text.contains("LlamaForCausalLM")
            && text.contains(DSPARK_ARCHITECTURE),
        "{text}"
    );

    let src = source(root.path(), "src");
    for (bits, group_size) in [(6, 64), (4, 128), (2, 32)] {
        let err = quantize_drafter_dir(&src, &root.path().join("b"), &options(bits, group_size))
            .expect_err("bad params");
        assert!(matches!(err, QuantizeError::PolicyParams { .. }), "{err}");
        assert!(
            err.to_string().contains("4|8") && err.to_string().contains("32|64"),
            "{err}"
        );
    }
    let nvfp4_group_32 = DrafterOptions {
        params: QuantParams {
            mode: QuantMode::Nvfp4,
            group_size: 32,
            bits: 4,
        },
        ..options(4, 32)
    };
    let err = quantize_drafter_dir(&src, &root.path().join("b"), &nvfp4_group_32)
        .expect_err("nvfp4 takes group 16");
    assert!(
        matches!(err, QuantizeError::UnsupportedParams { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("drafter: nvfp4 quantization does not take group size 32"),
        "{err}"
    );
    assert!(!root.path().join("b").exists());

    let quantized = root.path().join("quantized");
    quantize_drafter_dir(&src, &quantized, &options(4, 64)).expect("quantize");
    let err = quantize_drafter_dir(&quantized, &root.path().join("c"), &options(4, 64))
        .expect_err("already quantized");
    assert!(
        matches!(err, QuantizeError::AlreadyQuantized { .. }),
        "{err}"
    );
}
