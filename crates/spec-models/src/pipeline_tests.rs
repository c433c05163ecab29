//! A model split into pipeline stages and chained in one process gives the
//! whole model's bits: hidden states and taps of a mixed batch (prefill and
//! decoding rows at different offsets), after histories run through the
//! stages, for llama, GLM, GLM-5.2's IndexShare and the hybrid Qwen models
//! (recurrent caches on every rank); each stage holds less
//! than the whole model.

use std::path::Path;

use mlx_rs::Array;
use spec_core::{BatchRow, CacheSet, RowForm, Target};
use spec_fixtures::glm::Glm;
use spec_fixtures::llama::Llama;

use crate::batch_check::{mixed, Case};
use crate::layers::concat_taps;
use crate::pipeline::{load_stage, PipelineSlice, Stage};
use crate::{load_model, LoadOptions};

fn host(a: &Array) -> Vec<f32> {
    a.eval().expect("eval");
    a.as_slice::<f32>().to_vec()
}

/// One forward through the stages, rank `size - 1` first; `caches[r][i]`
/// is stage `r`'s set for row `i`; `pick` (ascending) names the rows run.
fn chain(
    stages: &[Box<dyn Stage>],
    caches: &mut [Vec<CacheSet>],
    rows: &[(&[u32], RowForm)],
    pick: &[usize],
    taps: &[usize],
) -> (Array, Option<Array>) {
    let mut h: Option<Array> = None;
    let mut tapped = Vec::new();
    for r in (0..stages.len()).rev() {
        let mut batch: Vec<BatchRow<'_>> = caches[r]
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| pick.contains(i))
            .zip(rows)
            .map(|((_, caches), (tokens, form))| BatchRow {
                tokens,
                caches,
                form: *form,
            })
            .collect();
        let (out, t) = stages[r]
            .run_stage(h.as_ref(), &mut batch, taps)
            .expect("stage");
        tapped.extend(t);
        h = Some(out);
    }
    let hidden = stages[0].finish(&h.expect("a stage")).expect("finish");
    (hidden, concat_taps(taps, &tapped).expect("taps"))
}

fn check(dir: &Path, size: usize, taps: &[usize]) {
    let options = LoadOptions::default();
    let whole = load_model(dir, &options).expect("whole model");
    let stages: Vec<Box<dyn Stage>> = (0..size)
        .map(|r| {
            load_stage(dir, &options, PipelineSlice::new(r, size).expect("slice")).expect("stage")
        })
        .collect();
    for s in &stages {
        assert!(
            s.target().weights_bytes() < whole.weights_bytes(),
            "a stage holds everything"
        );
        let one = Array::from_slice(&[1u32], &[1, 1]);
        let refused = s.target().forward(&one, &mut s.stage_caches(), &[]);
        assert!(refused.is_err(), "a slice ran a whole forward");
    }
    let cases: Vec<Case> = mixed(12);
    let mut whole_caches: Vec<CacheSet> = Vec::new();
    let mut stage_caches: Vec<Vec<CacheSet>> = stages
        .iter()
        .map(|s| cases.iter().map(|_| s.stage_caches()).collect())
        .collect();
    for (i, case) in cases.iter().enumerate() {
        let mut caches = whole.make_caches();
        for chunk in case.history.chunks(6) {
            let ids = Array::from_slice(chunk, &[1, chunk.len() as i32]);
            let a = whole.forward(&ids, &mut caches, &[]).expect("history");
            let b = chain(
                &stages,
                &mut stage_caches,
                &[(chunk, RowForm::Prefill)],
                &[i],
                &[],
            );
            assert_eq!(host(&a.hidden), host(&b.0), "row {i}: history");
        }
        whole_caches.push(caches);
    }
    let rows: Vec<(&[u32], RowForm)> = cases.iter().map(|c| (&c.window[..], c.form)).collect();
    let mut batch: Vec<BatchRow<'_>> = cases
        .iter()
        .zip(whole_caches.iter_mut())
        .map(|(c, caches)| BatchRow {
            tokens: &c.window,
            caches,
            form: c.form,
        })
        .collect();
    let want = whole.forward_batch(&mut batch, taps).expect("whole batch");
    let all: Vec<usize> = (0..cases.len()).collect();
    let (hidden, tapped) = chain(&stages, &mut stage_caches, &rows, &all, taps);
    assert_eq!(
        host(&want.hidden),
        host(&hidden),
        "{size} stages: hidden states"
    );
    match (&want.taps, &tapped) {
        (Some(a), Some(b)) => assert_eq!(host(a), host(b), "{size} stages: taps"),
        (None, None) => {}
        other => panic!("taps differ in presence: {other:?}"),
    }
}

#[test]
fn llama_stages_chained_equal_the_whole_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    Llama {
        layers: 4,
        ..Llama::tiny(3)
    }
    .write(dir.path())
    .expect("fixture");
    check(dir.path(), 2, &[3, 0]);
    check(dir.path(), 3, &[1, 2]);
}

/// `qwen3_moe` (Hugging Face's per-expert tensors; layer 0 dense): each
/// rank stacks its own layers' experts.
#[test]
fn qwen3_moe_stages_chained_equal_the_whole_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    Llama {
        layers: 4,
        vocab: 96,
        ..spec_fixtures::llama::GATE_QWEN3_MOE
    }
    .write(dir.path())
    .expect("fixture");
    check(dir.path(), 2, &[3, 0]);
}

#[test]
fn hybrid_stages_chained_equal_the_whole_model() {
    use spec_fixtures::qwen3_next::{Qwen3Next, GATE, GATE_QWEN3_5_MOE};
    for spec in [GATE.tiny(3), GATE_QWEN3_5_MOE.tiny(4)] {
        let dir = tempfile::tempdir().expect("tempdir");
        Qwen3Next {
            interval: 2,
            ..spec
        }
        .write(dir.path())
        .expect("fixture");
        check(dir.path(), 2, &[3, 0]);
    }
}

#[test]
fn a_hybrid_split_without_a_recurrent_layer_on_rank_0_is_refused() {
    use spec_fixtures::qwen3_next::{Qwen3Next, GATE};
    let dir = tempfile::tempdir().expect("tempdir");
    // Layers 0-3, every second full attention: rank 0 of 4 holds layer 3.
    Qwen3Next {
        interval: 2,
        ..GATE.tiny(3)
    }
    .write(dir.path())
    .expect("fixture");
    let slice = PipelineSlice::new(0, 4).expect("slice");
    let err = load_stage(dir.path(), &LoadOptions::default(), slice)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("no recurrent"), "{err}");
}

#[test]
fn glm_stages_chained_equal_the_whole_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    Glm {
        layers: 3,
        ..Glm::default()
    }
    .write(dir.path())
    .expect("fixture");
    check(dir.path(), 2, &[0, 2]);
    check(dir.path(), 3, &[]);
}

#[test]
fn glm52_index_share_stages_start_at_full_layers_and_equal_the_whole_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    Glm::glm52_tiny().write(dir.path()).expect("fixture");
    let stage = load_stage(
        dir.path(),
        &LoadOptions::default(),
        PipelineSlice::new(0, 2).expect("slice"),
    )
    .expect("stage");
    // FFSFS: the even split would start rank 0 at the shared layer 2.
    assert_eq!(stage.layer_range(), 1..5);
    check(dir.path(), 2, &[1]);
    check(dir.path(), 3, &[]);
}

#[test]
fn sliding_layers_off_rank_0_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    Llama {
        layers: 4,
        sliding_window: Some(4),
        ..Llama::tiny(3)
    }
    .write(dir.path())
    .expect("fixture");
    for rank in 0..2 {
        let slice = PipelineSlice::new(rank, 2).expect("slice");
        let err = load_stage(dir.path(), &LoadOptions::default(), slice).expect_err("refused");
        assert!(
            err.to_string()
                .contains("layer 0 is a sliding-window layer"),
            "{err}"
        );
    }
    let slice = PipelineSlice::new(0, 1).expect("slice");
    assert!(load_stage(dir.path(), &LoadOptions::default(), slice).is_ok());
}
