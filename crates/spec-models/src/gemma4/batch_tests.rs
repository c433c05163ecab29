//! Gemma-4's packed forward: every row of a mixed batch gives the bits it
//! gives alone, with sliding and full layers (a row past the window),
//! KV-shared layers and per-layer inputs, the expert block in both of its
//! forms, float and 4-bit.

use spec_core::RowForm;
use spec_fixtures::gemma4::{Gemma4, GATE_MOE, GATE_SHARED, GATE_TEXT};

use super::Model;
use crate::batch_check::{
    check_decode_rows, check_errors, check_rows_alone, mixed, quantized, Case,
};
use crate::LoadOptions;

/// The tests' sliding window: shorter than the longer rows' histories.
const WINDOW: usize = 6;

fn load(spec: &Gemma4) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

#[test]
fn sliding_and_full_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&GATE_TEXT.tiny(3, WINDOW));
    check_rows_alone(&model, &mixed(13), &[0, 2]);
}

#[test]
fn kv_shared_rows_read_their_own_donors() {
    let (_d, model) = load(&GATE_SHARED.tiny(4, WINDOW));
    check_rows_alone(&model, &mixed(13), &[1, 4]);
}

#[test]
fn expert_rows_in_a_batch_equal_rows_alone_in_both_forms() {
    let (_d, model) = load(&GATE_MOE.tiny(5, WINDOW));
    let mut cases = mixed(13);
    // 33 tokens route 66 picks: this row regroups by expert alone, the
    // others do not.
    let long: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 90).collect();
    cases.push(Case::new(1..3, &long, RowForm::Prefill));
    check_rows_alone(&model, &cases, &[2]);
}

#[test]
fn quantized_gemma4_rows_in_a_batch_equal_rows_alone() {
    let (dir, _) = load(&GATE_TEXT.tiny(6, WINDOW));
    let q4 = quantized(dir.path(), dir.path(), |_| false);
    let model = Model::load(&q4, &LoadOptions::default()).expect("load q4");
    check_rows_alone(&model, &mixed(13), &[]);
}

#[test]
fn gemma4_batch_errors_are_named_and_touch_no_cache() {
    let (_d, model) = load(&GATE_TEXT.tiny(3, WINDOW));
    check_errors(&model);
}

#[test]
fn gemma4_decode_rows_on_lazy_ids_equal_the_packed_forward() {
    let (_d, model) = load(&GATE_SHARED.tiny(3, WINDOW));
    check_decode_rows(&model);
}

/// `logits_before_softcap` is the head before Gemma-4's final softcap:
/// softcapped it gives `logits` bit for bit, and on hidden states large
/// enough for the cap to bite the two differ.
#[test]
fn logits_before_softcap_is_the_head_without_its_cap() {
    use spec_core::Target;
    let (_d, model) = load(&GATE_TEXT.tiny(3, WINDOW));
    let hidden = mlx_rs::random::normal::<f32>(&[1, 3, 64], None, None, None)
        .expect("normal")
        .multiply(mlx_rs::Array::from_f32(400.0))
        .expect("scale");
    let raw = model.logits_before_softcap(&hidden).expect("raw");
    let capped = model.logits(&hidden).expect("logits");
    let recapped = crate::layers::softcap(&raw, 30.0).expect("softcap");
    let bits = |a: &mlx_rs::Array| {
        a.as_slice::<f32>()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&recapped), bits(&capped));
    assert_ne!(bits(&raw), bits(&capped));
}
