//! A tiny DSpark checkpoint written on the fly (random weights from a fixed
//! MLX key), a target view of matching dimensions, and random taps.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};
use spec_core::{CacheSet, SpecError, Target, TargetInfo, TargetOutput};

pub const HIDDEN: i32 = 32;
pub const VOCAB: i32 = 64;
pub const RANK: i32 = 32;
pub const BLOCK: usize = 4;
pub const TAPS: i32 = 2;
pub const TARGET_LAYERS: usize = 3;

pub fn config() -> Value {
    json!({
        "architectures": ["Gemma4DSparkModel"],
        "model_type": "gemma4_text",
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "global_head_dim": 16,
        "num_global_key_value_heads": 2,
        "attention_k_eq_v": true,
        "intermediate_size": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0,
        "vocab_size": VOCAB,
        "block_size": BLOCK,
        "mask_token_id": 3,
        "target_layer_ids": [0, 2],
        "num_target_layers": TARGET_LAYERS,
        "markov_rank": RANK,
        "markov_head_type": "vanilla",
        "enable_confidence_head": true,
        "confidence_head_with_markov": true,
        "rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}}
    })
}

/// `(name, shape, mean)` of every tensor; norms and scalars centred on 1.
pub fn tensor_specs() -> Vec<(String, Vec<i32>, f32)> {
    let (h, v, r) = (HIDDEN, VOCAB, RANK);
    let mut t = vec![
        ("embed_tokens.weight".to_owned(), vec![v, h], 0.0),
        ("fc.weight".to_owned(), vec![h, TAPS * h], 0.0),
        ("hidden_norm.weight".to_owned(), vec![h], 1.0),
        ("norm.weight".to_owned(), vec![h], 1.0),
        ("lm_head.weight".to_owned(), vec![v, h], 0.0),
        ("markov_head.markov_w1.weight".to_owned(), vec![v, r], 0.0),
        ("markov_head.markov_w2.weight".to_owned(), vec![v, r], 0.0),
        (
            "confidence_head.proj.weight".to_owned(),
            vec![1, h + r],
            0.0,
        ),
        ("confidence_head.proj.bias".to_owned(), vec![1], 0.0),
    ];
    for i in 0..2 {
        let p = format!("layers.{i}");
        for (name, shape, mean) in [
            ("self_attn.q_proj.weight", vec![64, h], 0.0),
            ("self_attn.k_proj.weight", vec![32, h], 0.0),
            ("self_attn.o_proj.weight", vec![h, 64], 0.0),
            ("self_attn.q_norm.weight", vec![16], 1.0),
            ("self_attn.k_norm.weight", vec![16], 1.0),
            ("input_layernorm.weight", vec![h], 1.0),
            ("post_attention_layernorm.weight", vec![h], 1.0),
            ("pre_feedforward_layernorm.weight", vec![h], 1.0),
            ("post_feedforward_layernorm.weight", vec![h], 1.0),
            ("mlp.gate_proj.weight", vec![64, h], 0.0),
            ("mlp.up_proj.weight", vec![64, h], 0.0),
            ("mlp.down_proj.weight", vec![h, 64], 0.0),
            ("layer_scalar", vec![1], 1.0),
        ] {
            t.push((format!("{p}.{name}"), shape, mean));
        }
    }
    t
}

/// The random tensors of the fixture.
pub fn tensors() -> HashMap<String, Array> {
    tensor_specs()
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape, mean))| {
            let key = mlx_rs::random::key(1000 + i as u64).unwrap();
            let std = if mean == 1.0 { 0.1 } else { 0.3 };
            (
                name,
                mlx_rs::random::normal::<f32>(&shape[..], mean, std, &key).unwrap(),
            )
        })
        .collect()
}

/// Writes a checkpoint from `config` and `tensors` into `dir`.
pub fn write(dir: &Path, config: &Value, tensors: &HashMap<String, Array>) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    Array::save_safetensors(
        tensors.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        dir.join("model.safetensors"),
    )
    .unwrap();
}

/// The fixture, as written, in a fresh temporary directory.
pub fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &config(), &tensors());
    dir
}

/// Random taps `[1, rows, TAPS * HIDDEN]`.
pub fn taps(rows: i32, seed: u64) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    mlx_rs::random::normal::<f32>(&[1, rows, TAPS * HIDDEN][..], 0.0, 1.0, &key).unwrap()
}

/// A target with the given dimensions; only its `info` is ever read.
#[derive(Debug)]
pub struct FakeTarget(pub TargetInfo);

pub fn target() -> FakeTarget {
    FakeTarget(TargetInfo {
        model_type: "llama".into(),
        vocab_size: VOCAB as usize,
        hidden_size: HIDDEN as usize,
        num_layers: TARGET_LAYERS,
        context_length: None,
    })
}

impl Target for FakeTarget {
    fn info(&self) -> &TargetInfo {
        &self.0
    }
    fn make_caches(&self) -> CacheSet {
        CacheSet::default()
    }
    fn forward(&self, _: &Array, _: &mut CacheSet, _: &[usize]) -> Result<TargetOutput, SpecError> {
        Err(SpecError::Invalid("the fake target does not run".into()))
    }
    fn logits(&self, _: &Array) -> Result<Array, SpecError> {
        Err(SpecError::Invalid("the fake target does not run".into()))
    }
    fn embed(&self, _: &Array) -> Result<Array, SpecError> {
        Err(SpecError::Invalid("the fake target does not run".into()))
    }
    fn weights_bytes(&self) -> usize {
        0
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

pub fn to_vec(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// A tiny llama target of the fixture's dimensions (3 layers, hidden 32,
/// vocabulary 64), random weights.
pub fn tiny_llama(dir: &Path) {
    let (h, inter, kv) = (HIDDEN, 64, 16);
    let config = json!({
        "model_type": "llama", "hidden_size": h, "num_hidden_layers": TARGET_LAYERS, "intermediate_size": inter,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": VOCAB,
        "tie_word_embeddings": false, "rope_theta": 10000.0
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut n = 0u64;
    let mut normal = |shape: &[i32], mean: f32, std: f32| {
        n += 1;
        let key = mlx_rs::random::key(5000 + n).unwrap();
        mlx_rs::random::normal::<f32>(shape, mean, std, &key).unwrap()
    };
    let mut t: HashMap<String, Array> = HashMap::new();
    t.insert(
        "model.embed_tokens.weight".into(),
        normal(&[VOCAB, h], 0.0, 0.5),
    );
    t.insert("lm_head.weight".into(), normal(&[VOCAB, h], 0.0, 0.25));
    t.insert("model.norm.weight".into(), normal(&[h], 1.0, 0.1));
    for l in 0..TARGET_LAYERS {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj", [h, h]),
            ("self_attn.k_proj", [kv, h]),
            ("self_attn.v_proj", [kv, h]),
            ("self_attn.o_proj", [h, h]),
            ("mlp.gate_proj", [inter, h]),
            ("mlp.up_proj", [inter, h]),
            ("mlp.down_proj", [h, inter]),
        ] {
            t.insert(format!("{p}.{name}.weight"), normal(&shape, 0.0, 0.25));
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            t.insert(format!("{p}.{norm}.weight"), normal(&[h], 1.0, 0.1));
        }
    }
    Array::save_safetensors(&t, None, dir.join("model.safetensors")).unwrap();
}
