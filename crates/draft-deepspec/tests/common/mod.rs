//! A tiny DSpark checkpoint written on the fly (the `spec_fixtures` layout at
//! test size), a target view of matching dimensions, and random taps.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, Dtype};
use serde_json::Value;
use spec_core::{CacheSet, SpecError, Target, TargetInfo, TargetOutput};
use spec_fixtures::dspark::Dspark;
use spec_fixtures::llama::Llama;
use spec_fixtures::{Data, Init};

/// The fixture's layout: `spec_fixtures`' DSpark drafter at test size.
pub const LAYOUT: Dspark = Dspark::tiny();
pub const HIDDEN: i32 = LAYOUT.hidden as i32;
pub const VOCAB: i32 = LAYOUT.vocab as i32;
pub const RANK: i32 = LAYOUT.markov_rank as i32;
pub const BLOCK: usize = LAYOUT.block_size;
pub const TAPS: i32 = LAYOUT.taps.len() as i32;
pub const TARGET_LAYERS: usize = LAYOUT.target_layers;

pub fn config() -> Value {
    LAYOUT.config()
}

/// `(name, shape, init)` of every tensor.
pub fn tensor_specs() -> Vec<(String, Vec<usize>, Init)> {
    LAYOUT
        .tensors()
        .into_iter()
        .map(|s| (s.name, s.shape, s.init))
        .collect()
}

/// The random tensors of the fixture.
pub fn tensors() -> HashMap<String, Array> {
    LAYOUT
        .tensors()
        .iter()
        .map(|s| {
            let t = s.draw(LAYOUT.seed, LAYOUT.name);
            let Data::F32(v) = t.data else {
                panic!("{}: float32 expected", t.name)
            };
            let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
            (t.name, Array::from_slice(&v, &shape))
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
    LAYOUT.write(dir.path()).unwrap();
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
        Err(SpecError::Internal("the fake target does not run"))
    }
    fn logits(&self, _: &Array) -> Result<Array, SpecError> {
        Err(SpecError::Internal("the fake target does not run"))
    }
    fn embed(&self, _: &Array) -> Result<Array, SpecError> {
        Err(SpecError::Internal("the fake target does not run"))
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
/// vocabulary 64, untied), random weights.
pub fn tiny_llama(dir: &Path) {
    Llama {
        hidden: HIDDEN as usize,
        layers: TARGET_LAYERS,
        vocab: VOCAB as usize,
        intermediate: 64,
        tied: false,
        ..Llama::tiny(5000)
    }
    .write(dir)
    .unwrap();
}
