//! The expert layers of `qwen3_next` (switch layout, every second layer)
//! and `qwen3_5_moe` (Hugging Face's fused experts, every layer): decoding
//! rows keep the bits they have alone whatever shares their forward (a
//! verify window of 17 rows is 68 picks, past mlx-lm's sorting threshold,
//! and still equals 17 one-token steps), prompt chunks take mlx-lm's form,
//! quantized experts too; Hugging Face's per-expert `qwen3_next` tensors
//! are stacked as mlx-lm's sanitize stacks them.

use std::collections::HashMap;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_fixtures::qwen3_next::{Qwen3Next, GATE_MOE, GATE_QWEN3_5_MOE};

use super::Model;
use crate::batch_check::{check_rows_alone, check_window_equals_steps, expert_cases, quantized};
use crate::weights::Weights;
use crate::LoadOptions;

fn tiny(spec: Qwen3Next, seed: u64) -> Qwen3Next {
    Qwen3Next {
        interval: 2,
        ..spec.tiny(seed)
    }
}

fn load(spec: &Qwen3Next) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

fn bits(a: &Array) -> Vec<u32> {
    a.eval().expect("eval");
    a.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn expert_rows_in_a_batch_equal_rows_alone() {
    for spec in [tiny(GATE_MOE, 3), tiny(GATE_QWEN3_5_MOE, 4)] {
        let (_d, model) = load(&spec);
        assert!(model
            .blocks
            .iter()
            .any(|b| matches!(b.mlp, super::FeedForward::Sparse(_))));
        check_rows_alone(&model, &expert_cases(), &[0, 1]);
    }
}

#[test]
fn quantized_expert_rows_in_a_batch_equal_rows_alone() {
    let (dir, _) = load(&tiny(GATE_MOE, 3));
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    let model = Model::load(&q4, &LoadOptions::default()).expect("load q4");
    check_rows_alone(&model, &expert_cases(), &[1]);
}

#[test]
fn a_verify_window_of_17_rows_equals_17_one_token_steps() {
    let (_d, model) = load(&tiny(GATE_MOE, 5));
    check_window_equals_steps(&model, 9);
}

#[test]
fn hugging_faces_per_expert_tensors_are_stacked_as_mlx_lm_does_and_the_mtp_heads_too() {
    let (_d, model) = load(&tiny(GATE_MOE, 3));
    let c = model.config().clone();
    let moe = c.moe.expect("experts");
    let h = c.hidden;
    let value = |seed: f32, shape: &[i32]| {
        let n: i32 = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| seed + i as f32 * 0.001).collect();
        Array::from_slice(&v, shape)
    };
    let mut tensors = HashMap::new();
    // Layer 1's expert block and the MTP head's.
    for mlp in ["model.layers.1.mlp", "mtp.layers.0.mlp"] {
        for e in 0..moe.experts {
            for (k, n) in ["gate_proj", "up_proj"].iter().enumerate() {
                tensors.insert(
                    format!("{mlp}.experts.{e}.{n}.weight"),
                    value(e as f32 + k as f32 / 10.0, &[moe.intermediate, h]),
                );
            }
            tensors.insert(
                format!("{mlp}.experts.{e}.down_proj.weight"),
                value(e as f32, &[h, moe.intermediate]),
            );
        }
    }
    tensors.insert("mtp.fc.weight".into(), value(0.0, &[2, 2]));
    tensors.insert("mtp.pre_fc_norm_hidden.weight".into(), value(0.25, &[h]));
    tensors.insert("model.norm.weight".into(), value(0.5, &[h]));
    tensors.insert(
        "model.layers.0.linear_attn.conv1d.weight".into(),
        value(0.0, &[c.linear.conv_channels(), 1, c.linear.kernel]),
    );
    let mut w = Weights::from_map("hf".into(), tensors);
    super::sanitize::qwen3_next(&mut w, &c, false).expect("sanitize");
    assert!(w.contains("mtp.fc.weight"), "the MTP head is kept");
    for mlp in ["model.layers.1.mlp", "mtp.layers.0.mlp"] {
        let up = w
            .take(&format!("{mlp}.switch_mlp.up_proj.weight"))
            .expect("stacked");
        assert_eq!(up.shape(), [moe.experts, moe.intermediate, h]);
        let third = up.index(2);
        assert_eq!(
            bits(&third),
            bits(&value(2.0 + 1.0 / 10.0, &[moe.intermediate, h]))
        );
        assert!(!w.contains(&format!("{mlp}.experts.0.up_proj.weight")));
    }
    let mtp_norm = w.take("mtp.pre_fc_norm_hidden.weight").expect("norm");
    let shifted = value(0.25, &[h]).add(Array::from_f32(1.0)).expect("add");
    assert_eq!(
        bits(&mtp_norm),
        bits(&shifted),
        "the head's norms shift too"
    );
    let norm = w.take("model.norm.weight").expect("norm");
    let shifted = value(0.5, &[h]).add(Array::from_f32(1.0)).expect("add");
    assert_eq!(bits(&norm), bits(&shifted), "zero-centred scale + 1");
    let conv = w
        .take("model.layers.0.linear_attn.conv1d.weight")
        .expect("conv");
    assert_eq!(conv.shape(), [c.linear.conv_channels(), c.linear.kernel, 1]);
}
