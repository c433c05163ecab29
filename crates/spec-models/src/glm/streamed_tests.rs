//! GLM with its routed experts streamed from disk against the resident
//! model, on synthetic checkpoints whose routed experts exceed the tier
//! several times over: the same logits bit for bit, alone and in a batch,
//! in float and 4-bit, at tier sizes from one layer's experts up.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{BatchRow, RowForm, Target};

use super::Model;
use crate::batch_check::{mixed, prepared, quantized, Case};
use crate::{LoadOptions, ModelError};
use spec_fixtures::glm::Glm as TinyGlm;

fn streamed(dir: &std::path::Path, bytes: usize) -> Result<Model, ModelError> {
    let options = LoadOptions {
        expert_cache_bytes: Some(bytes),
        ..LoadOptions::default()
    };
    Model::load(dir, &options)
}

/// One expert's bytes, from the error a zero-byte tier gives.
fn expert_bytes(dir: &std::path::Path) -> usize {
    match streamed(dir, 0) {
        Err(ModelError::ExpertTier { needed, .. }) => needed as usize,
        other => panic!("a zero-byte tier must be refused: {other:?}"),
    }
}

fn bits(a: &Array) -> Vec<u32> {
    let f = a.as_dtype(Dtype::Float32).expect("f32");
    f.eval().expect("eval");
    f.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Greedy decoding from a 33-token prompt (66 picks: the sorted form),
/// then one token at a time past `index_topk`: each step's logits' bits and
/// the tokens.
fn greedy(model: &Model, steps: usize) -> (Vec<Vec<u32>>, Vec<u32>) {
    let prompt: Vec<u32> = (0..33).map(|i| (i * 7 + 3) % 90).collect();
    let mut caches = model.make_caches();
    let mut x = ids(&prompt);
    let (mut logits, mut tokens) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let out = model.forward(&x, &mut caches, &[]).expect("forward");
        let last = model
            .logits(&out.hidden.index((.., -1, ..)))
            .expect("logits");
        let next = mlx_rs::ops::indexing::argmax_axis(&last, -1, None)
            .expect("argmax")
            .item_cast::<u32>();
        logits.push(bits(&last));
        tokens.push(next);
        x = ids(&[next]);
    }
    (logits, tokens)
}

/// The packed forward over `cases` (rows of different lengths and forms):
/// its logits' bits.
fn batch_bits(model: &Model, cases: &[Case]) -> Vec<u32> {
    let mut caches: Vec<_> = cases.iter().map(|c| prepared(model, c)).collect();
    let mut rows: Vec<BatchRow<'_>> = cases
        .iter()
        .zip(caches.iter_mut())
        .map(|(c, caches)| BatchRow {
            tokens: &c.window,
            caches,
            form: c.form,
        })
        .collect();
    let out = model.forward_batch(&mut rows, &[]).expect("forward_batch");
    bits(&model.logits(&out.hidden).expect("logits"))
}

fn check(dir: &std::path::Path, moe_layers: usize, experts: usize) {
    let resident = Model::load(dir, &LoadOptions::default()).expect("resident");
    let want = greedy(&resident, 6);
    let mut cases = mixed(14);
    let long: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 90).collect();
    cases.push(Case::new(1..4, &long, RowForm::Prefill));
    let want_batch = batch_bits(&resident, &cases);
    let layer = experts * expert_bytes(dir);
    for bytes in [layer, 2 * layer + 1, moe_layers * layer] {
        let model = streamed(dir, bytes).expect("streamed");
        assert!(
            model.weights_bytes() < resident.weights_bytes(),
            "experts left on disk"
        );
        let got = greedy(&model, 6);
        assert_eq!(got.1, want.1, "tier {bytes}: tokens");
        assert!(got.0 == want.0, "tier {bytes}: logits bit for bit");
        assert!(
            batch_bits(&model, &cases) == want_batch,
            "tier {bytes}: batch"
        );
        let stats = model.expert_stats().expect("streamed");
        assert!(stats.misses > 0 && stats.resident_bytes as usize <= bytes);
        if bytes < moe_layers * layer {
            assert!(
                stats.bytes_read > stats.capacity_bytes,
                "the tier evicted and reread"
            );
        }
    }
    assert!(resident.expert_stats().is_none());
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
