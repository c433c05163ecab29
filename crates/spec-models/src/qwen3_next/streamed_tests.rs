//! `qwen3_next` (mlx-lm's switch layout, float and 4-bit) and `qwen3_5_moe`
//! (Hugging Face's fused experts under `model.language_model`, renamed at
//! load) with their routed experts streamed from disk: the resident
//! model's logits bit for bit (`streamed_check`), and a model without
//! experts refusing the option by name.

use spec_fixtures::qwen3_next::{Qwen3Next, GATE_MOE, GATE_QWEN3_5, GATE_QWEN3_5_MOE};

use crate::batch_check::quantized;
use crate::streamed_check::{check, streamed};

fn write(spec: Qwen3Next, seed: u64) -> (tempfile::TempDir, usize, usize) {
    let spec = Qwen3Next {
        interval: 2,
        ..spec.tiny(seed)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let experts = spec.experts.expect("experts").count;
    let sparse = (0..spec.layers).filter(|&i| spec.sparse(i)).count();
    (dir, sparse, experts)
}

#[test]
fn streamed_qwen3_next_equals_the_resident_model_bit_for_bit_in_float_and_4_bits() {
    let (dir, sparse, experts) = write(GATE_MOE, 3);
    check(dir.path(), sparse, experts);
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    check(&q4, sparse, experts);
}

#[test]
fn streamed_qwen3_5_moe_reads_hugging_faces_fused_experts_under_their_stored_names() {
    let (dir, sparse, experts) = write(GATE_QWEN3_5_MOE, 4);
    check(dir.path(), sparse, experts);
}

#[test]
fn a_model_without_experts_refuses_the_tier_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    GATE_QWEN3_5.tiny(5).write(dir.path()).expect("fixture");
    let err = streamed(dir.path(), 1 << 20)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("--expert-cache-bytes") && err.contains("no routed experts"),
        "{err}"
    );
}
