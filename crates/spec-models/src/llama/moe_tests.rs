//! `qwen3_moe`'s expert layers in the llama family: decoding rows keep the
//! bits they have alone whatever shares their forward (a verify window of
//! 17 rows is 68 picks, past mlx-lm's sorting threshold, and still equals
//! 17 one-token steps), prompt chunks take mlx-lm's form, quantized
//! experts too; Hugging Face's per-expert tensors load as mlx-lm's stacked
//! ones; streamed experts give the resident model's bits; bad expert keys
//! are named.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde_json::json;
use spec_core::Target;
use spec_fixtures::llama::{Experts, Llama, GATE_QWEN3_MOE};

use super::Model;
use crate::batch_check::{bits, ids};
use crate::batch_check::{check_rows_alone, check_window_equals_steps, expert_cases, quantized};
use crate::streamed_check::check;
use crate::LoadOptions;

/// The gate's `qwen3_moe` at the tiny llama's vocabulary, in either layout,
/// with three layers (the first dense).
fn tiny(seed: u64, per_expert: bool) -> Llama {
    let experts = GATE_QWEN3_MOE.experts.map(|e| Experts { per_expert, ..e });
    Llama {
        name: "tiny-qwen3-moe",
        seed,
        vocab: 96,
        layers: 3,
        experts,
        ..GATE_QWEN3_MOE
    }
}

fn load(spec: &Llama) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

#[test]
fn expert_rows_in_a_batch_equal_rows_alone_in_either_layout() {
    for per_expert in [true, false] {
        let (_d, model) = load(&tiny(3, per_expert));
        let sparse = |b: &super::Block| matches!(b.mlp, super::FeedForward::Sparse(_));
        let kinds: Vec<bool> = model.blocks.iter().map(sparse).collect();
        assert_eq!(kinds, [false, true, true], "layer 0 is MLP-only");
        assert!(!model.split_invariant(), "an expert layer sorts prompts");
        check_rows_alone(&model, &expert_cases(), &[0, 2]);
    }
}

#[test]
fn quantized_expert_rows_in_a_batch_equal_rows_alone() {
    let (dir, _) = load(&tiny(3, false));
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    let model = Model::load(&q4, &LoadOptions::default()).expect("load q4");
    check_rows_alone(&model, &expert_cases(), &[1]);
}

#[test]
fn a_verify_window_of_17_rows_equals_17_one_token_steps() {
    let (_d, model) = load(&tiny(5, true));
    check_window_equals_steps(&model, 9);
}

/// The stacked checkpoint rewritten with per-expert tensors (Hugging
/// Face's layout) loads to the same model, bit for bit.
#[test]
fn hugging_faces_per_expert_tensors_load_as_the_stacked_ones() {
    let spec = tiny(7, false);
    let (stacked_dir, stacked) = load(&spec);
    let hf_dir = tempfile::tempdir().expect("tempdir");
    spec.write(hf_dir.path()).expect("fixture");
    let path = hf_dir.path().join("model.safetensors");
    let mut tensors = Array::load_safetensors(&path).expect("load");
    for layer in [1, 2] {
        let p = format!("model.layers.{layer}.mlp");
        for m in ["gate_proj", "up_proj", "down_proj"] {
            let all = tensors
                .remove(&format!("{p}.switch_mlp.{m}.weight"))
                .expect("stacked experts");
            for e in 0..8 {
                tensors.insert(format!("{p}.experts.{e}.{m}.weight"), all.index(e));
            }
        }
    }
    // Loaded arrays read their file lazily: write a new file, then drop the old.
    Array::save_safetensors(&tensors, None, hf_dir.path().join("model-hf.safetensors"))
        .expect("save");
    std::fs::remove_file(&path).expect("remove");
    let hf = Model::load(hf_dir.path(), &LoadOptions::default()).expect("load hf");
    let prompt: Vec<u32> = (1..=20).collect();
    let logits = |m: &Model| {
        let mut caches = m.make_caches();
        let out = m.forward(&ids(&prompt), &mut caches, &[]).expect("forward");
        bits(&m.logits(&out.hidden).expect("logits"))
    };
    assert_eq!(logits(&stacked), logits(&hf));
    drop(stacked_dir);
}

#[test]
fn streamed_experts_equal_the_resident_model_in_either_layout_and_in_4_bits() {
    for per_expert in [true, false] {
        let (dir, _) = load(&tiny(9, per_expert));
        check(dir.path(), 2, 8);
    }
    let (dir, _) = load(&tiny(9, false));
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    check(&q4, 2, 8);
}

#[test]
fn bad_expert_keys_are_errors_naming_the_key() {
    let spec = tiny(11, false);
    let cases = [
        (
            "num_experts_per_tok",
            json!(9),
            "num_experts_per_tok must lie in 1..=8",
        ),
        (
            "mlp_only_layers",
            json!([3]),
            "mlp_only_layers names layer 3 of 3",
        ),
        (
            "decoder_sparse_step",
            json!(0),
            "decoder_sparse_step must be positive",
        ),
        (
            "moe_intermediate_size",
            json!(0),
            "moe_intermediate_size must be positive",
        ),
        (
            "head_dim",
            serde_json::Value::Null,
            "qwen3_moe configs must give head_dim",
        ),
    ];
    for (key, value, want) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        spec.write(dir.path()).expect("fixture");
        let mut config = spec.config();
        config[key] = value;
        std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
        let err = Model::load(dir.path(), &LoadOptions::default())
            .expect_err(key)
            .to_string();
        assert!(
            err.contains(want) && err.contains("config.json"),
            "{key}: {err}"
        );
    }
}

#[test]
fn dense_models_stay_split_invariant() {
    let (_d, model) = load(&Llama::tiny(1));
    assert!(model.split_invariant());
    assert!(model.config().moe.is_none());
}
