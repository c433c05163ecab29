//! `gpt_oss` in the llama family: sliding and full layers in turn with
//! attention sinks, YaRN RoPE, a biased router picking the top logits and
//! biased experts with the clamped SwiGLU. Decoding rows keep the bits they
//! have alone whatever shares their forward (a verify window of 17 rows is
//! 68 picks, past mlx-lm's sorting threshold), prompt chunks take mlx-lm's
//! form, quantized too; what it cannot do is refused by name.

use spec_core::{RowForm, Target};
use spec_fixtures::llama::{Llama, GATE_GPT_OSS};

use super::Model;
use crate::batch_check::{check_rows_alone, mixed, quantized, Case};
use crate::cache::KvQuantization;
use crate::streamed_check::{bits, ids};
use crate::LoadOptions;

/// The gate's `gpt_oss` at the tiny llama's vocabulary, four layers.
fn tiny(seed: u64) -> Llama {
    Llama {
        name: "tiny-gpt-oss",
        seed,
        vocab: 96,
        layers: 4,
        ..GATE_GPT_OSS
    }
}

fn write(spec: &Llama) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    dir
}

fn load(dir: &std::path::Path) -> Model {
    Model::load(dir, &LoadOptions::default()).expect("load")
}

/// `mixed` plus a 33-token prompt chunk (past the window of 8; 132 picks,
/// sorted alone) and a 17-row decoding window (68 picks, never sorted).
fn cases() -> Vec<Case> {
    let mut cases = mixed(14);
    let long: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 90).collect();
    cases.push(Case::new(1..4, &long, RowForm::Prefill));
    let window: Vec<u32> = (0..17).map(|i| (i * 7 + 2) % 90).collect();
    cases.push(Case::new(20..31, &window, RowForm::Decode));
    cases
}

#[test]
fn rows_in_a_batch_equal_rows_alone_float_and_quantized() {
    let dir = write(&tiny(3));
    let model = load(dir.path());
    assert!(!model.split_invariant(), "an expert layer sorts prompts");
    check_rows_alone(&model, &cases(), &[0, 3]);
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.router"));
    check_rows_alone(&load(&q4), &cases(), &[1]);
}

#[test]
fn a_verify_window_of_17_rows_past_the_window_equals_17_one_token_steps() {
    let dir = write(&tiny(5));
    let model = load(dir.path());
    let prompt: Vec<u32> = (0..12).map(|i| (i * 11 + 4) % 90).collect();
    let next: Vec<u32> = (0..17).map(|i| (i * 13 + 6) % 90).collect();
    let mut steps = model.make_caches();
    model
        .forward(&ids(&prompt), &mut steps, &[])
        .expect("prefill");
    let mut want = Vec::new();
    for t in &next {
        let out = model.decode(&ids(&[*t]), &mut steps, &[]).expect("step");
        want.extend(bits(&model.logits(&out.hidden).expect("logits")));
    }
    let mut window = model.make_caches();
    model
        .forward(&ids(&prompt), &mut window, &[])
        .expect("prefill");
    let out = model.decode(&ids(&next), &mut window, &[]).expect("window");
    assert_eq!(bits(&model.logits(&out.hidden).expect("logits")), want);
}

#[test]
fn quantized_caches_and_streamed_experts_are_refused_by_name() {
    let dir = write(&tiny(7));
    let kv = LoadOptions {
        kv_quantization: Some(KvQuantization::new(4, 64, 0).expect("params")),
        ..LoadOptions::default()
    };
    let err = Model::load(dir.path(), &kv)
        .expect_err("kv-bits")
        .to_string();
    assert!(err.contains("--kv-bits") && err.contains("sinks"), "{err}");
    let streamed = LoadOptions {
        expert_cache_bytes: Some(1 << 20),
        ..LoadOptions::default()
    };
    let err = Model::load(dir.path(), &streamed)
        .expect_err("streamed")
        .to_string();
    assert!(
        err.contains("--expert-cache-bytes") && err.contains("gpt_oss"),
        "{err}"
    );
}

/// Hugging Face's unquantized layout (a float `gate_up_proj`, which
/// mlx-lm's sanitize slices along the wrong axis) is refused by name.
#[test]
fn a_float_fused_expert_projection_is_refused_by_name() {
    let dir = write(&tiny(9));
    let path = dir.path().join("model.safetensors");
    let mut tensors = mlx_rs::Array::load_safetensors(&path).expect("load");
    let gate = tensors
        .remove("model.layers.0.mlp.experts.gate_proj.weight")
        .expect("gate");
    tensors.insert("model.layers.0.mlp.experts.gate_up_proj".into(), gate);
    mlx_rs::Array::save_safetensors(&tensors, None, dir.path().join("model-hf.safetensors"))
        .expect("save");
    std::fs::remove_file(&path).expect("remove");
    let err = Model::load(dir.path(), &LoadOptions::default())
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("model.layers.0.mlp.experts.gate_up_proj") && err.contains("not read"),
        "{err}"
    );
}
