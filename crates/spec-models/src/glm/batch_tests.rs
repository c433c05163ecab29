//! GLM's packed forward: every row of a mixed batch gives the bits it gives
//! alone: MLA in both forms (prefill rows expanded, decoding rows absorbed),
//! the DSA indexer's picks past `index_topk`, IndexShare's shared layers, the
//! MoE in both forms, float and 4-bit.

use spec_core::RowForm;

use super::{GlmOptions, Model};
use crate::batch_check::{
    check_decode_rows, check_errors, check_rows_alone, mixed, quantized, Case,
};
use crate::LoadOptions;
use spec_fixtures::glm::Glm as TinyGlm;

fn load(spec: &TinyGlm) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model =
        Model::load_with(dir.path(), &LoadOptions::default(), GlmOptions::default()).expect("load");
    (dir, model)
}

/// `mixed` plus a 33-token prompt chunk (66 expert picks: the MoE regroups
/// it by expert when it runs alone) and a 4-token decode row past
/// `index_topk`.
fn cases() -> Vec<Case> {
    let mut cases = mixed(14);
    let long: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 90).collect();
    cases.push(Case::new(1..4, &long, RowForm::Prefill));
    cases.push(Case::new(20..31, &[6, 2, 8, 3], RowForm::Decode));
    cases
}

#[test]
fn glm_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&TinyGlm::default());
    check_rows_alone(&model, &cases(), &[0, 1]);
}

#[test]
fn index_share_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&TinyGlm::glm52_tiny());
    check_rows_alone(&model, &cases(), &[2, 4]);
}

#[test]
fn quantized_glm_rows_in_a_batch_equal_rows_alone() {
    let (dir, _) = load(&TinyGlm::default());
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("mlp.gate"));
    let model = Model::load(&q4, &LoadOptions::default()).expect("load q4");
    check_rows_alone(&model, &cases(), &[1]);
}

#[test]
fn glm_batch_errors_are_named_and_touch_no_cache() {
    let (_d, model) = load(&TinyGlm::default());
    check_errors(&model);
}

#[test]
fn glm_decode_rows_on_lazy_ids_equal_the_packed_forward() {
    let (_d, model) = load(&TinyGlm::default());
    check_decode_rows(&model);
}
