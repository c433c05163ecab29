//! The llama family's packed forward: every row of a mixed batch gives the
//! bits it gives alone (full and sliding layers, float and 4-bit).

use spec_fixtures::llama::Llama;

use super::check::{check_errors, check_rows_alone, mixed, quantized};
use crate::{llama, LoadOptions};

fn load(spec: &Llama) -> (tempfile::TempDir, llama::Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = llama::Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

#[test]
fn llama_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&Llama::tiny(3));
    check_rows_alone(&model, &mixed(12), &[0, 1]);
}

#[test]
fn a_sliding_layer_row_past_its_window_equals_it_alone() {
    let (_d, model) = load(&Llama {
        sliding_window: Some(4),
        ..Llama::tiny(5)
    });
    check_rows_alone(&model, &mixed(11), &[1]);
}

#[test]
fn quantized_llama_rows_in_a_batch_equal_rows_alone() {
    let (dir, _) = load(&Llama::tiny(7));
    let q4 = quantized(dir.path(), dir.path(), |_| false);
    let model = llama::Model::load(&q4, &LoadOptions::default()).expect("load q4");
    check_rows_alone(&model, &mixed(12), &[]);
}

#[test]
fn llama_batch_errors_are_named_and_touch_no_cache() {
    let (_d, model) = load(&Llama::tiny(3));
    check_errors(&model);
}
