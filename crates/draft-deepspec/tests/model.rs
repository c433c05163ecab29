//! Loading, config validation and the forward of `DSparkModel` on a tiny
//! checkpoint written by the test.

#![allow(clippy::unwrap_used)]

mod common;

use draft_deepspec::{check_target, Context, DSparkError, DSparkModel, DrafterError};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};
use spec_core::{GreedySampler, TargetInfo};
use spec_runtime::{DtypePolicy, LoadOptions, ModelError};

fn load(dir: &std::path::Path) -> Result<DSparkModel, DSparkError> {
    DSparkModel::load(dir, &LoadOptions::default())
}

fn with_config(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> DSparkError {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::config();
    edit(c.as_object_mut().unwrap());
    common::write(dir.path(), &c, &common::tensors());
    load(dir.path()).expect_err("the config must be refused")
}

#[test]
fn loads_and_projects_context_to_the_hidden_width() {
    let dir = common::checkpoint();
    let m = load(dir.path()).unwrap();
    // The reload smoke of quantize-drafter: zeros of width taps*H -> [1, 1, H].
    let zeros = Array::zeros::<f32>(&[1, 1, common::TAPS * common::HIDDEN]).unwrap();
    assert_eq!(
        m.project_context(&zeros).unwrap().shape(),
        &[1, 1, common::HIDDEN]
    );
    let projected = m.project_context(&common::taps(5, 1)).unwrap();
    assert_eq!(projected.shape(), &[1, 5, common::HIDDEN]);
    assert!(common::to_vec(&projected).iter().all(|x| x.is_finite()));
    assert!(m.weights_bytes() > 0);
    let wrong = Array::zeros::<f32>(&[1, 1, common::HIDDEN]).unwrap();
    assert!(matches!(
        m.project_context(&wrong),
        Err(DSparkError::Drafter(DrafterError::Shape { .. }))
    ));
}

#[test]
fn every_unsupported_value_is_its_own_typed_error() {
    let unsupported = |key: &str, value: Value| {
        let k = key.to_owned();
        match with_config(|c| drop(c.insert(k.clone(), value))) {
            DSparkError::Drafter(DrafterError::Unsupported { key: got, .. }) => {
                assert_eq!(got, key)
            }
            other => panic!("{key}: {other}"),
        }
    };
    unsupported("attention_k_eq_v", json!(false));
    unsupported("hidden_activation", json!("gelu"));
    unsupported("markov_head_type", json!("gated"));
    unsupported("attention_bias", json!(true));
    unsupported("enable_moe_block", json!(true));
    unsupported("target_layer_ids", json!([-1, 0]));
    match with_config(|c| {
        drop(c.insert(
            "rope_parameters".into(),
            json!({"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}),
        ))
    }) {
        DSparkError::Drafter(DrafterError::Unsupported { key, .. }) => {
            assert!(key.contains("rope_type"), "{key}")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn missing_and_invalid_keys_are_named() {
    for key in [
        "block_size",
        "target_layer_ids",
        "mask_token_id",
        "markov_head_type",
        "confidence_head_with_markov",
        "attention_k_eq_v",
    ] {
        match with_config(|c| drop(c.remove(key))) {
            DSparkError::Drafter(DrafterError::MissingKey { key: got, .. }) => assert_eq!(got, key),
            other => panic!("{key}: {other}"),
        }
    }
    for (key, value) in [
        ("target_layer_ids", json!([0, 3])),
        ("target_layer_ids", json!([2, 0])),
        ("target_layer_ids", json!([])),
        ("mask_token_id", json!(64)),
        ("block_size", json!(0)),
        ("hidden_size", json!("wide")),
    ] {
        let v = value.clone();
        match with_config(|c| drop(c.insert(key.into(), v))) {
            DSparkError::Drafter(DrafterError::InvalidValue { key: got, .. }) => {
                assert_eq!(got, key, "{value}")
            }
            other => panic!("{key}={value}: {other}"),
        }
    }
    assert!(matches!(
        with_config(|c| drop(c.insert("architectures".into(), json!(["LlamaForCausalLM"])))),
        DSparkError::NotDSpark { .. }
    ));
}

#[test]
fn missing_misshaped_and_leftover_tensors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = common::tensors();
    t.remove("markov_head.markov_w2.weight");
    common::write(dir.path(), &common::config(), &t);
    match load(dir.path()) {
        Err(DSparkError::Model(ModelError::MissingTensor { name, .. })) => {
            assert_eq!(name, "markov_head.markov_w2.weight")
        }
        other => panic!("{other:?}"),
    }
    let mut t = common::tensors();
    t.insert(
        "fc.weight".into(),
        Array::zeros::<f32>(&[common::HIDDEN, common::HIDDEN]).unwrap(),
    );
    common::write(dir.path(), &common::config(), &t);
    match load(dir.path()) {
        Err(DSparkError::Model(ModelError::TensorShape { name, .. })) => {
            assert_eq!(name, "fc.weight")
        }
        other => panic!("{other:?}"),
    }
    let mut t = common::tensors();
    t.insert(
        "layers.0.self_attn.v_proj.weight".into(),
        Array::zeros::<f32>(&[32, common::HIDDEN]).unwrap(),
    );
    common::write(dir.path(), &common::config(), &t);
    match load(dir.path()) {
        Err(DSparkError::Model(ModelError::UnexpectedTensors { names, .. })) => {
            assert_eq!(names, ["layers.0.self_attn.v_proj.weight"])
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn target_mismatches_are_refused() {
    let dir = common::checkpoint();
    let m = load(dir.path()).unwrap();
    check_target(&m, &common::target()).unwrap();
    let info = |f: &dyn Fn(&mut TargetInfo)| {
        let mut t = common::target();
        f(&mut t.0);
        t
    };
    for (what, t) in [
        ("hidden_size", info(&|i| i.hidden_size = 48)),
        ("vocab_size", info(&|i| i.vocab_size = 65)),
        ("num_target_layers", info(&|i| i.num_layers = 2)),
    ] {
        match check_target(&m, &t) {
            Err(DSparkError::Drafter(DrafterError::TargetMismatch { what: got, .. })) => {
                assert_eq!(got, what)
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// The context grown round by round (each chunk roped at its own offset)
/// drafts what the context built in one go drafts.
#[test]
fn incremental_context_equals_one_shot_context() {
    let dir = common::checkpoint();
    let m = load(dir.path()).unwrap();
    let taps = common::taps(7, 3);
    let mut whole = Context::default();
    m.extend_context(&mut whole, &taps).unwrap();
    let mut parts = Context::default();
    use mlx_rs::ops::indexing::IndexOp;
    for (a, b) in [(0, 3), (3, 4), (4, 7)] {
        m.extend_context(&mut parts, &taps.index((.., a..b, ..)))
            .unwrap();
    }
    assert_eq!((whole.len(), parts.len()), (7, 7));
    let (x, y) = (
        common::to_vec(&m.block_hidden(&whole, 9).unwrap()),
        common::to_vec(&m.block_hidden(&parts, 9).unwrap()),
    );
    let worst = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "largest difference {worst}");
    let p = m.propose(&whole, 9, &mut GreedySampler).unwrap();
    let q = m.propose(&parts, 9, &mut GreedySampler).unwrap();
    assert_eq!(p.tokens, q.tokens);
    assert_eq!(p.tokens.len(), common::BLOCK);
    // A context that differs (shifted rows) gives a different block.
    let mut other = Context::default();
    m.extend_context(&mut other, &taps.index((.., 1..7, ..)))
        .unwrap();
    let z = common::to_vec(&m.block_hidden(&other, 9).unwrap());
    assert!(x.iter().zip(&z).any(|(a, b)| (a - b).abs() > 1e-3));
}

/// The Markov pass: each draft is the argmax of the base logits plus the
/// Markov bias of the token before it, recomputed here from the weights.
#[test]
fn markov_correction_follows_the_previous_token() {
    let dir = common::checkpoint();
    let m = load(dir.path()).unwrap();
    let mut ctx = Context::default();
    m.extend_context(&mut ctx, &common::taps(4, 5)).unwrap();
    let anchor = 11;
    let p = m.propose(&ctx, anchor, &mut GreedySampler).unwrap();
    let base = common::to_vec(&m.logits(&m.block_hidden(&ctx, anchor).unwrap()).unwrap());
    let t = common::tensors();
    let (w1, w2) = (
        common::to_vec(&t["markov_head.markov_w1.weight"]),
        common::to_vec(&t["markov_head.markov_w2.weight"]),
    );
    let (v, r) = (common::VOCAB as usize, common::RANK as usize);
    let mut prev = anchor as usize;
    for (j, &tok) in p.tokens.iter().enumerate() {
        let score = |c: usize| {
            base[j * v + c]
                + (0..r)
                    .map(|k| w1[prev * r + k] * w2[c * r + k])
                    .sum::<f32>()
        };
        let best = (0..v)
            .max_by(|&a, &b| score(a).total_cmp(&score(b)))
            .unwrap();
        assert_eq!(tok as usize, best, "position {j}");
        prev = tok as usize;
    }
    let c = p.confidences.unwrap();
    assert_eq!(c.len(), common::BLOCK);
    assert!(c.iter().all(|&x| x > 0.0 && x < 1.0));
}

#[test]
fn quantized_checkpoints_load_dequantized_or_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = common::tensors();
    let mut quantized = 0;
    for (name, _, _) in common::tensor_specs() {
        let Some(module) = name.strip_suffix(".weight") else {
            continue;
        };
        if t[&name].ndim() != 2 || module == "confidence_head.proj" || t[&name].shape()[1] % 32 != 0
        {
            continue;
        }
        let (w, s, b) = mlx_rs::ops::quantize(&t[&name], 32, 4).unwrap();
        t.insert(name.clone(), w);
        t.insert(format!("{module}.scales"), s);
        t.insert(format!("{module}.biases"), b);
        quantized += 1;
    }
    assert!(quantized > 10);
    let mut c = common::config();
    let block =
        json!({"group_size": 32, "bits": 4, "mode": "affine", "confidence_head.proj": false});
    c["quantization"] = block.clone();
    c["quantization_config"] = block;
    common::write(dir.path(), &c, &t);
    let float = DSparkModel::load(
        dir.path(),
        &LoadOptions {
            dtype: DtypePolicy::Float32,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let kept = DSparkModel::load(
        dir.path(),
        &LoadOptions {
            dtype: DtypePolicy::Keep,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert!(kept.weights_bytes() < float.weights_bytes());
    let taps = common::taps(3, 8);
    let (mut a, mut b) = (Context::default(), Context::default());
    float.extend_context(&mut a, &taps).unwrap();
    kept.extend_context(&mut b, &taps).unwrap();
    let (x, y) = (
        common::to_vec(&float.block_hidden(&a, 2).unwrap()),
        common::to_vec(&kept.block_hidden(&b, 2).unwrap()),
    );
    let worst = x
        .iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst < 1e-2,
        "quantized matmul vs dequantized weights differ by {worst}"
    );
    // The 4-bit drafter is not the float one.
    let full = load(common::checkpoint().path()).unwrap();
    let mut f = Context::default();
    full.extend_context(&mut f, &taps).unwrap();
    let z = common::to_vec(&full.block_hidden(&f, 2).unwrap());
    assert!(x.iter().zip(&z).any(|(p, q)| (p - q).abs() > 1e-3));
}

#[test]
fn bf16_checkpoints_run_in_float32() {
    let dir = tempfile::tempdir().unwrap();
    let t: std::collections::HashMap<String, Array> = common::tensors()
        .into_iter()
        .map(|(k, v)| (k, v.as_dtype(Dtype::Bfloat16).unwrap()))
        .collect();
    common::write(dir.path(), &common::config(), &t);
    let m = load(dir.path()).unwrap();
    let out = m.project_context(&common::taps(2, 4)).unwrap();
    assert_eq!(out.dtype(), Dtype::Float32);
    let mut ctx = Context::default();
    m.extend_context(&mut ctx, &common::taps(2, 4)).unwrap();
    assert_eq!(m.block_hidden(&ctx, 1).unwrap().dtype(), Dtype::Float32);
}

/// Parameters saved under a `model.` wrapper load as the bare layout does.
#[test]
fn a_model_prefixed_layout_loads_the_same_drafter() {
    let dir = tempfile::tempdir().unwrap();
    let prefixed = common::tensors()
        .into_iter()
        .map(|(k, v)| (format!("model.{k}"), v))
        .collect();
    common::write(dir.path(), &common::config(), &prefixed);
    let (a, b) = (
        load(dir.path()).unwrap(),
        load(common::checkpoint().path()).unwrap(),
    );
    let taps = common::taps(3, 21);
    let (mut x, mut y) = (Context::default(), Context::default());
    a.extend_context(&mut x, &taps).unwrap();
    b.extend_context(&mut y, &taps).unwrap();
    assert_eq!(
        common::to_vec(&a.block_hidden(&x, 5).unwrap()),
        common::to_vec(&b.block_hidden(&y, 5).unwrap())
    );
}
