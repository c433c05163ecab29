//! `gpt_oss` in the llama family: sliding and full layers in turn with
//! attention sinks, YaRN RoPE, a biased router picking the top logits and
//! biased experts with the clamped SwiGLU. Decoding rows keep the bits they
//! have alone whatever shares their forward (a verify window of 17 rows is
//! 68 picks, past mlx-lm's sorting threshold), prompt chunks take mlx-lm's
//! form, quantized too; streamed experts give the resident model's bits;
//! what it cannot do is refused by name.

use spec_core::Target;
use spec_fixtures::llama::{Llama, GATE_GPT_OSS};

use super::Model;
use crate::batch_check::{check_rows_alone, check_window_equals_steps, expert_cases, quantized};
use crate::cache::KvQuantization;
use crate::streamed_check::check;
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

#[test]
fn rows_in_a_batch_equal_rows_alone_float_and_quantized() {
    let dir = write(&tiny(3));
    let model = load(dir.path());
    assert!(!model.split_invariant(), "an expert layer sorts prompts");
    check_rows_alone(&model, &expert_cases(), &[0, 3]);
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.router"));
    check_rows_alone(&load(&q4), &expert_cases(), &[1]);
}

#[test]
fn a_verify_window_of_17_rows_past_the_window_equals_17_one_token_steps() {
    let dir = write(&tiny(5));
    check_window_equals_steps(&load(dir.path()), 12);
}

#[test]
fn quantized_caches_are_refused_by_name() {
    let dir = write(&tiny(7));
    let kv = LoadOptions {
        kv_quantization: Some(KvQuantization::new(4, 64, 0).expect("params")),
        ..LoadOptions::default()
    };
    let err = Model::load(dir.path(), &kv)
        .expect_err("kv-bits")
        .to_string();
    assert!(err.contains("--kv-bits") && err.contains("sinks"), "{err}");
}

/// Streamed experts (their biases resident) give the resident model's
/// bits, float and quantized; OpenAI's layout, whose expert rows
/// interleave gate and up, is refused by name.
#[test]
fn streamed_experts_equal_the_resident_model_and_the_hub_layout_is_refused() {
    let dir = write(&tiny(11));
    let layers = tiny(11).layers;
    check(dir.path(), layers, 8);
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.router"));
    check(&q4, layers, 8);
    let hub = tempfile::tempdir().expect("tempdir");
    let mut tensors =
        mlx_rs::Array::load_safetensors(dir.path().join("model.safetensors")).expect("load");
    let gate = tensors
        .remove("model.layers.0.mlp.experts.gate_proj.weight")
        .expect("gate");
    tensors.insert(
        "model.layers.0.mlp.experts.gate_up_proj_blocks".into(),
        gate,
    );
    mlx_rs::Array::save_safetensors(&tensors, None, hub.path().join("model.safetensors"))
        .expect("save");
    std::fs::copy(
        dir.path().join("config.json"),
        hub.path().join("config.json"),
    )
    .expect("config");
    let streamed = LoadOptions {
        expert_cache_bytes: Some(1 << 20),
        ..LoadOptions::default()
    };
    let err = Model::load(hub.path(), &streamed)
        .expect_err("the hub layout")
        .to_string();
    assert!(
        err.contains("--expert-cache-bytes") && err.contains("gate_up_proj_blocks"),
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
