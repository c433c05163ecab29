//! The DSpark drafter policy (`quantize::drafter`) on a synthetic
//! DSpark-shaped checkpoint with the real tensor names: what is quantized
//! (gather tables included), what stays full precision and is recorded
//! `false`, the smoke hook, and the refusals.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};
use spec_models::quantize::drafter::{quantize_drafter_dir, DrafterOptions, DSPARK_ARCHITECTURE};
use spec_models::quantize::QuantizeError;

const H: i32 = 64;
const TAPS: i32 = 2;
const VOCAB: i32 = 96;
const RANK: i32 = 64;
const HEADS: i32 = 2;
const HEAD_DIM: i32 = 32;
const FF: i32 = 128;

fn config(architecture: &str) -> Value {
    json!({
        "architectures": [architecture], "model_type": "gemma4_dspark", "hidden_size": H, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "global_head_dim": HEAD_DIM, "num_global_key_value_heads": 1,
        "attention_k_eq_v": true, "intermediate_size": FF, "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0, "vocab_size": VOCAB, "block_size": 4,
        "mask_token_id": 4, "target_layer_ids": [0, 1], "num_target_layers": 2, "markov_rank": RANK,
        "markov_head_type": "vanilla", "enable_confidence_head": true, "confidence_head_with_markov": true,
    })
}

/// Names and shapes of reference-semantics.md's DSpark checkpoint.
fn shapes() -> Vec<(String, Vec<i32>)> {
    let mut s: Vec<(String, Vec<i32>)> = vec![
        ("embed_tokens.weight".into(), vec![VOCAB, H]),
        ("fc.weight".into(), vec![H, TAPS * H]),
        ("hidden_norm.weight".into(), vec![H]),
        ("norm.weight".into(), vec![H]),
        ("lm_head.weight".into(), vec![VOCAB, H]),
        ("markov_head.markov_w1.weight".into(), vec![VOCAB, RANK]),
        ("markov_head.markov_w2.weight".into(), vec![VOCAB, RANK]),
        ("confidence_head.proj.weight".into(), vec![1, H + RANK]),
        ("confidence_head.proj.bias".into(), vec![1]),
    ];
    let l = "layers.0";
    for (n, shape) in [
        ("self_attn.q_proj.weight", vec![HEADS * HEAD_DIM, H]),
        ("self_attn.k_proj.weight", vec![HEAD_DIM, H]),
        ("self_attn.o_proj.weight", vec![H, HEADS * HEAD_DIM]),
        ("self_attn.q_norm.weight", vec![HEAD_DIM]),
        ("self_attn.k_norm.weight", vec![HEAD_DIM]),
        ("input_layernorm.weight", vec![H]),
        ("post_attention_layernorm.weight", vec![H]),
        ("pre_feedforward_layernorm.weight", vec![H]),
        ("post_feedforward_layernorm.weight", vec![H]),
        ("mlp.gate_proj.weight", vec![FF, H]),
        ("mlp.up_proj.weight", vec![FF, H]),
        ("mlp.down_proj.weight", vec![H, FF]),
        ("layer_scalar", vec![1]),
    ] {
        s.push((format!("{l}.{n}"), shape));
    }
    s
}

fn tensors() -> HashMap<String, Array> {
    shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n: i32 = shape.iter().product();
            let salt = name.len() as i32;
            let data: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 + salt * 31) % 211) as f32 / 211.0 - 0.5)
                .collect();
            (name, Array::from_slice(&data, &shape))
        })
        .collect()
}

fn source(root: &Path, architecture: &str) -> PathBuf {
    let dir = root.join(format!("src-{architecture}"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("config.json"), config(architecture).to_string()).expect("config");
    std::fs::write(dir.join("tokenizer.json"), "{}").expect("tokenizer");
    Array::save_safetensors(tensors(), None, dir.join("model.safetensors")).expect("weights");
    dir
}

fn options(bits: i32, group_size: i32) -> DrafterOptions {
    DrafterOptions {
        bits,
        group_size,
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
    let src = source(root.path(), DSPARK_ARCHITECTURE);
    let source_tensors = tensors();
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

#[test]
fn the_smoke_test_sees_the_written_output_and_its_failure_is_reported() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    let src = {
        std::fs::create_dir_all(&src).expect("mkdir");
        source(&src, DSPARK_ARCHITECTURE)
    };
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
    let target = source(root.path(), "LlamaForCausalLM");
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

    let src = source(root.path(), DSPARK_ARCHITECTURE);
    for (bits, group_size) in [(6, 64), (4, 128), (2, 32)] {
        let err = quantize_drafter_dir(&src, &root.path().join("b"), &options(bits, group_size))
            .expect_err("bad params");
        assert!(
            matches!(err, QuantizeError::UnsupportedParams { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("4|8") && err.to_string().contains("32|64"),
            "{err}"
        );
    }
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
