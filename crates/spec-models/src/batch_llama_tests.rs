//! The llama family's packed forward: every row of a mixed batch gives the
//! bits it gives alone (full and sliding layers, float and 4-bit).

use spec_fixtures::llama::Llama;

use crate::batch_check::{
    check_decode_rows, check_errors, check_rows_alone, decoding, mixed, quantized, Case,
};
use crate::{llama, LoadOptions};
use spec_core::RowForm;
use spec_runtime::batch::attention::groups_run;

/// `check_rows_alone`, asserting the grouped attention ran (on Linux,
/// where it is exact): a test of grouping cannot pass with every row alone.
fn check_grouped(model: &llama::Model, cases: &[Case], taps: &[usize]) {
    let before = groups_run();
    check_rows_alone(model, cases, taps);
    if cfg!(target_os = "linux") {
        assert!(groups_run() > before, "no rows attended as a group");
    }
}

fn load(spec: &Llama) -> (tempfile::TempDir, llama::Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let model = llama::Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

#[test]
fn llama_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = load(&Llama::tiny(3));
    check_grouped(&model, &mixed(12), &[0, 1]);
}

#[test]
fn eight_decoding_rows_grouped_equal_rows_alone() {
    let (_d, model) = load(&Llama::tiny(3));
    check_grouped(&model, &decoding(8, 1), &[1]);
}

#[test]
fn verify_windows_grouped_equal_rows_alone() {
    let (_d, model) = load(&Llama::tiny(4));
    check_grouped(&model, &decoding(6, 4), &[]);
}

#[test]
fn groups_beside_prefill_rows_equal_rows_alone() {
    let (_d, model) = load(&Llama::tiny(6));
    let mut cases = decoding(5, 1);
    cases.extend(decoding(3, 4));
    cases.insert(2, Case::new(0..30, &[9; 20], RowForm::Prefill));
    cases.insert(6, Case::new([], &[1, 2, 3, 4, 5, 6, 7], RowForm::Prefill));
    check_grouped(&model, &cases, &[0]);
}

#[test]
fn llama3_rope_rows_grouped_equal_rows_alone() {
    let (_d, model) = load(&Llama {
        llama3_rope: true,
        ..Llama::tiny(8)
    });
    check_grouped(&model, &decoding(5, 2), &[]);
}

#[test]
fn a_sliding_layer_row_past_its_window_equals_it_alone() {
    let (_d, model) = load(&Llama {
        sliding_window: Some(4),
        ..Llama::tiny(5)
    });
    check_grouped(&model, &mixed(11), &[1]);
}

#[test]
fn sliding_layer_groups_past_their_window_equal_rows_alone() {
    let (_d, model) = load(&Llama {
        sliding_window: Some(5),
        ..Llama::tiny(9)
    });
    // Sliding caches cannot roll back once they rotate: no trimmed rows.
    let untrimmed = |cases: Vec<Case>| -> Vec<Case> {
        cases.into_iter().map(|c| Case { trim: 0, ..c }).collect()
    };
    let mut cases = untrimmed(decoding(6, 1));
    cases.extend(untrimmed(decoding(4, 3)));
    check_grouped(&model, &cases, &[0]);
}

/// Verify windows of many lengths (prompt lookup's 1 + 0..16 drafts) and a
/// short prompt tail: each group pads its rows' windows to its longest, the
/// rows append and see only their real keys.
fn ragged() -> Vec<Case> {
    let mut cases = Vec::new();
    for (n, l) in [(2, 1), (2, 2), (1, 3), (2, 5), (1, 7), (2, 12), (2, 17)] {
        cases.extend(decoding(n, l));
    }
    cases.insert(4, Case::new(0..9, &[4; 6], RowForm::Prefill));
    cases
}

#[test]
fn ragged_verify_windows_grouped_equal_rows_alone() {
    let (_d, model) = load(&Llama::tiny(10));
    check_grouped(&model, &ragged(), &[0]);
}

#[test]
fn ragged_sliding_groups_past_their_window_equal_rows_alone() {
    let (_d, model) = load(&Llama {
        sliding_window: Some(6),
        ..Llama::tiny(11)
    });
    let cases = ragged()
        .into_iter()
        .map(|c| Case { trim: 0, ..c })
        .collect::<Vec<_>>();
    check_grouped(&model, &cases, &[1]);
}

/// Caches bounded to 10 positions (`--max-kv-size`): rows past the bound,
/// grouped and padded, see the 4 kept positions and their recent ones as
/// they do alone, verify windows rolled back too; beside a sliding layer.
#[test]
fn bounded_rows_in_a_batch_equal_rows_alone() {
    let options = LoadOptions {
        max_kv_size: Some(10),
        ..LoadOptions::default()
    };
    for sliding_window in [None, Some(6)] {
        let dir = tempfile::tempdir().expect("tempdir");
        Llama {
            sliding_window,
            ..Llama::tiny(14)
        }
        .write(dir.path())
        .expect("fixture");
        let model = llama::Model::load(dir.path(), &options).expect("load");
        let rotating_free = |cases: Vec<Case>| -> Vec<Case> {
            match sliding_window {
                // The sliding layer cannot roll back once it rotates.
                Some(_) => cases.into_iter().map(|c| Case { trim: 0, ..c }).collect(),
                None => cases,
            }
        };
        check_grouped(&model, &rotating_free(ragged()), &[0]);
        check_grouped(&model, &rotating_free(decoding(8, 1)), &[]);
    }
}

#[test]
fn quantized_llama_rows_in_a_batch_equal_rows_alone() {
    let (dir, _) = load(&Llama::tiny(7));
    let q4 = quantized(dir.path(), dir.path(), |_| false);
    let model = llama::Model::load(&q4, &LoadOptions::default()).expect("load q4");
    check_grouped(&model, &mixed(12), &[]);
}

#[test]
fn llama_batch_errors_are_named_and_touch_no_cache() {
    let (_d, model) = load(&Llama::tiny(3));
    check_errors(&model);
}

#[test]
fn llama_decode_rows_on_lazy_ids_equal_the_packed_forward() {
    let (_d, model) = load(&Llama::tiny(3));
    check_decode_rows(&model);
}

/// A llama whose full-attention keys and values are kept quantized
/// (`--kv-bits`) from position `start`, head dimension 32 so that a group
/// of 32 fits.
fn kv_quantized(spec: Llama, bits: i32, start: usize) -> (tempfile::TempDir, llama::Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    Llama {
        head_dim: Some(32),
        ..spec
    }
    .write(dir.path())
    .expect("fixture");
    let options = LoadOptions {
        kv_quantization: Some(crate::cache::KvQuantization::new(bits, 32, start).expect("params")),
        ..LoadOptions::default()
    };
    let model = llama::Model::load(dir.path(), &options).expect("load");
    (dir, model)
}

/// Quantized caches: every row of a ragged batch (verify windows of 1 to
/// 17 tokens, some after a rollback, a prompt tail) gives its bits alone,
/// the grouped rows over padded packed caches too (or, before the start,
/// float rows), beside float sliding layers as well; with a start among
/// the rows' windows (rows on both sides, some across it), every row alone.
#[test]
fn kv_quantized_rows_in_a_batch_equal_rows_alone() {
    let (_d, model) = kv_quantized(Llama::tiny(12), 4, 0);
    check_grouped(&model, &ragged(), &[0]);
    check_grouped(&model, &decoding(8, 1), &[]);
    let (_d, before) = kv_quantized(Llama::tiny(12), 4, 400);
    check_grouped(&before, &decoding(8, 4), &[]);
    let (_d, across) = kv_quantized(Llama::tiny(12), 4, 14);
    check_rows_alone(&across, &ragged(), &[0]);
    let (_d, sliding) = kv_quantized(
        Llama {
            sliding_window: Some(6),
            ..Llama::tiny(13)
        },
        8,
        0,
    );
    let cases = mixed(11)
        .into_iter()
        .map(|c| Case { trim: 0, ..c })
        .collect::<Vec<_>>();
    check_grouped(&sliding, &cases, &[]);
}

/// What speculation relies on with quantized caches: a verify window's
/// logits are the bits of its tokens decoded one at a time, and a
/// rolled-back window leaves the cache as if it never ran; from the first
/// position, and with the start inside the window (its rows before the
/// start read float keys, the others quantized ones).
#[test]
fn kv_quantized_verify_window_equals_tokens_one_at_a_time() {
    for start in [0, 25] {
        verify_window_equals_steps(start);
    }
}

fn verify_window_equals_steps(start: usize) {
    use spec_core::Target;
    let (dir, model) = kv_quantized(Llama::tiny(14), 4, start);
    let ids = |t: &[u32]| mlx_rs::Array::from_slice(t, &[1, t.len() as i32]);
    let host = |a: &mlx_rs::Array| {
        a.eval().expect("eval");
        a.as_slice::<f32>().to_vec()
    };
    let prompt: Vec<u32> = (0..23).map(|i| (i * 7 + 3) % 90).collect();
    let window = [5u32, 17, 29, 41, 53];
    let mut stepped = model.make_caches();
    model
        .forward(&ids(&prompt), &mut stepped, &[])
        .expect("prompt");
    let mut one_by_one = Vec::new();
    for t in window {
        let out = model.decode(&ids(&[t]), &mut stepped, &[]).expect("step");
        one_by_one.extend(host(&model.logits(&out.hidden).expect("logits")));
    }
    let mut verified = model.make_caches();
    model
        .forward(&ids(&prompt), &mut verified, &[])
        .expect("prompt");
    // A rejected draft first: three tokens verified, then rolled back.
    model
        .decode(&ids(&[1, 2, 3]), &mut verified, &[])
        .expect("rejected");
    verified.trim(3).expect("roll back");
    let out = model
        .decode(&ids(&window), &mut verified, &[])
        .expect("window");
    assert_eq!(
        host(&model.logits(&out.hidden).expect("logits")),
        one_by_one,
        "a verify window's rows differ from decoding its tokens one by one"
    );
    assert_eq!(verified.offset(), stepped.offset());
    // The same weights with float caches: quantization changed the logits
    // (the option took effect).
    let float = llama::Model::load(dir.path(), &LoadOptions::default()).expect("load");
    let mut caches = float.make_caches();
    float
        .forward(&ids(&prompt), &mut caches, &[])
        .expect("prompt");
    let out = float
        .decode(&ids(&window), &mut caches, &[])
        .expect("window");
    assert_ne!(
        host(&float.logits(&out.hidden).expect("logits")),
        one_by_one
    );
}
