//! GLM with its routed experts streamed from disk against the resident
//! model, on synthetic checkpoints whose routed experts exceed the tier
//! several times over: the same logits bit for bit, alone and in a batch,
//! in float and 4-bit, at tier sizes from one layer's experts up.

use spec_core::Target;

use super::Model;
use crate::batch_check::quantized;
use crate::batch_check::{bits, ids};
use crate::streamed_check::{check, expert_bytes};
use crate::{LoadOptions, ModelError};
use spec_fixtures::glm::Glm as TinyGlm;

fn streamed(dir: &std::path::Path, bytes: usize) -> Result<Model, ModelError> {
    let options = LoadOptions {
        expert_cache_bytes: Some(bytes),
        ..LoadOptions::default()
    };
    Model::load(dir, &options)
}

#[test]
fn streamed_glm52_equals_the_resident_model_bit_for_bit() {
    let dir = tempfile::tempdir().expect("dir");
    let spec = TinyGlm::glm52_tiny();
    spec.write(dir.path()).expect("fixture");
    check(dir.path(), spec.layers - spec.first_dense, spec.experts);
}

#[test]
fn streamed_4bit_glm_equals_the_resident_model_bit_for_bit() {
    let dir = tempfile::tempdir().expect("dir");
    let spec = TinyGlm {
        layers: 4,
        ..TinyGlm::default()
    };
    spec.write(dir.path()).expect("fixture");
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    check(&q4, spec.layers - spec.first_dense, spec.experts);
}

/// A shard truncated while serving fails the forward naming the file and
/// an expert tensor; once the file is whole again a new request gets the
/// resident model's bits from the same model.
#[test]
fn a_truncated_shard_fails_the_forward_by_name_and_the_model_recovers() {
    let dir = tempfile::tempdir().expect("dir");
    let spec = TinyGlm::glm52_tiny();
    spec.write(dir.path()).expect("fixture");
    let resident = Model::load(dir.path(), &LoadOptions::default()).expect("resident");
    let model = streamed(dir.path(), spec.experts * expert_bytes(dir.path())).expect("streamed");
    let shards: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    let saved: Vec<Vec<u8>> = shards
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    for (path, bytes) in shards.iter().zip(&saved) {
        std::fs::write(path, &bytes[..bytes.len() / 2]).expect("truncate");
    }
    let prompt: Vec<u32> = (1..12).collect();
    let err = model
        .forward(&ids(&prompt), &mut model.make_caches(), &[])
        .expect_err("truncated")
        .to_string();
    assert!(
        err.contains(".safetensors") && err.contains("mlp.switch_mlp."),
        "{err}"
    );
    for (path, bytes) in shards.iter().zip(&saved) {
        std::fs::write(path, bytes).expect("restore");
    }
    let run = |m: &Model| {
        let out = m
            .forward(&ids(&prompt), &mut m.make_caches(), &[])
            .expect("forward");
        bits(&m.logits(&out.hidden).expect("logits"))
    };
    assert!(run(&model) == run(&resident));
}

/// `--mtp-expert-bits 8` keeps the MTP row's experts at 8 bits: float ones
/// are quantized at load, 4-bit ones are refused naming the module and the
/// option.
#[test]
fn mtp_experts_at_8_bits_are_quantized_from_float_and_refused_from_4_bits() {
    let dir = tempfile::tempdir().expect("dir");
    let spec = TinyGlm::default();
    spec.write(dir.path()).expect("fixture");
    let options = LoadOptions {
        mtp_expert_bits: Some(8),
        ..LoadOptions::default()
    };
    let model = Model::load(dir.path(), &options).expect("8-bit MTP experts");
    assert_eq!(model.mtp_expert_bits(), Some(8));
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    let err = Model::load(&q4, &options)
        .expect_err("4-bit MTP experts")
        .to_string();
    let row = format!("model.layers.{}.mlp.switch_mlp", spec.layers);
    assert!(
        err.contains(&row)
            && err.contains("stored at 4 bits")
            && err.contains("--mtp-expert-bits 8"),
        "{err}"
    );
}
