//! The check every architecture's batched-forward tests run: rows brought
//! to different offsets, one `forward_batch` over them, and the same rows
//! run alone through `forward` / `decode` on identically prepared caches,
//! compared bit for bit.

use std::path::Path;

use mlx_rs::Array;
use spec_core::{BatchRow, CacheSet, InputError, RowForm, SpecError, Target};

use crate::config::QuantParams;
use std::sync::Arc;

use crate::quantize::{quantize_dir, ModuleChoice, QuantizeOptions};

/// One request of a test batch.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    /// Tokens run (as prefill chunks) before the batch: the row's offset.
    pub history: Vec<u32>,
    /// The row's window in the batch.
    pub window: Vec<u32>,
    /// Its form.
    pub form: RowForm,
    /// Tokens rolled back after the history (stale keys past the cursor).
    pub trim: usize,
}

impl Case {
    pub fn new(history: impl IntoIterator<Item = u32>, window: &[u32], form: RowForm) -> Self {
        Self {
            history: history.into_iter().collect(),
            window: window.to_vec(),
            form,
            trim: 0,
        }
    }

    /// The case with its last `n` history tokens rolled back before the
    /// batch, as after a rejected draft.
    pub fn trimmed(self, n: usize) -> Self {
        Self { trim: n, ..self }
    }
}

/// `n` decoding rows of one window length `l` at distinct offsets, some
/// across the caches' growth step (256), some rolled back: the rows a
/// serving step groups.
pub(crate) fn decoding(n: usize, l: usize) -> Vec<Case> {
    let lengths = [0usize, 3, 17, 255, 256, 258, 300, 41, 129, 9];
    (0..n)
        .map(|i| {
            let history =
                (0..lengths[i % lengths.len()] as u32).map(move |t| (t * 13 + i as u32) % 90);
            let window: Vec<u32> = (0..l as u32)
                .map(|t| (t * 5 + 2 * i as u32 + 1) % 90)
                .collect();
            let case = Case::new(history, &window, RowForm::Decode);
            match i % 3 {
                2 if case.history.len() > 5 => case.trimmed(4),
                _ => case,
            }
        })
        .collect()
}

/// The mixed batch the tests use, for a vocabulary of at least 96: a decode
/// row of one token and one of four, a prefill chunk from offset 0, a prefill
/// chunk continuing a prompt, and a decode row with the first row's window at
/// another offset (positions are per row). `long` tokens of history for the
/// last row (past a sliding window or `index_topk`).
pub(crate) fn mixed(long: u32) -> Vec<Case> {
    vec![
        Case::new(10..19, &[5], RowForm::Decode),
        Case::new(40..45, &[7, 8, 9, 11], RowForm::Decode),
        Case::new([], &[3, 1, 4, 1, 5, 9, 2], RowForm::Prefill),
        Case::new(60..66, &[20, 21, 22, 23, 24], RowForm::Prefill),
        Case::new((0..long).map(|i| (i * 7 + 3) % 90), &[5], RowForm::Decode),
    ]
}

/// [`mixed`] plus what an expert layer sorts or must not: a 33-token prompt
/// chunk (at 4 picks a token, 132 picks: sorted by expert when it runs
/// alone) and a 17-row decoding window (68 picks: never sorted).
pub(crate) fn expert_cases() -> Vec<Case> {
    let mut cases = mixed(14);
    let long: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 90).collect();
    cases.push(Case::new(1..4, &long, RowForm::Prefill));
    let window: Vec<u32> = (0..17).map(|i| (i * 7 + 2) % 90).collect();
    cases.push(Case::new(20..31, &window, RowForm::Decode));
    cases
}

/// A verify window of 17 rows after a prompt of `prompt` tokens gives the
/// logits of 17 one-token steps, bit for bit (the decoding form whatever
/// the window's length: expert layers past their sorting threshold,
/// sliding layers past their window).
pub(crate) fn check_window_equals_steps(model: &dyn Target, prompt: usize) {
    let prompt: Vec<u32> = (0..prompt as u32).map(|i| (i * 11 + 4) % 90).collect();
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

fn host(a: &Array) -> Vec<f32> {
    a.eval().expect("eval");
    a.as_dtype(mlx_rs::Dtype::Float32)
        .expect("f32")
        .as_slice::<f32>()
        .to_vec()
}

/// `a`'s values as float32 bits.
pub(crate) fn bits(a: &Array) -> Vec<u32> {
    host(a).iter().map(|v| v.to_bits()).collect()
}

/// One row of `tokens`.
pub(crate) fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Caches brought to the case's offset by prefill chunks of at most 6.
pub(crate) fn prepared(model: &dyn Target, case: &Case) -> CacheSet {
    let mut caches = model.make_caches();
    for chunk in case.history.chunks(6) {
        let out = model
            .forward(&ids(chunk), &mut caches, &[])
            .expect("history");
        out.hidden.eval().expect("eval");
    }
    if case.trim > 0 {
        caches.trim(case.trim).expect("trim");
    }
    caches
}

fn run_alone(
    model: &dyn Target,
    case: &Case,
    caches: &mut CacheSet,
    taps: &[usize],
) -> spec_core::TargetOutput {
    let x = ids(&case.window);
    match case.form {
        RowForm::Prefill => model.forward(&x, caches, taps),
        RowForm::Decode => model.decode(&x, caches, taps),
    }
    .expect("alone")
}

/// Runs `cases` as one batch and alone; every row's hidden states, taps and
/// logits must be the same bits, the offsets the same, and one more decode
/// step on each row's caches the same bits (the caches hold the same keys).
pub(crate) fn check_rows_alone(model: &dyn Target, cases: &[Case], taps: &[usize]) {
    let mut alone_caches: Vec<CacheSet> = cases.iter().map(|c| prepared(model, c)).collect();
    let mut batch_caches: Vec<CacheSet> = cases.iter().map(|c| prepared(model, c)).collect();
    let before: Vec<usize> = batch_caches.iter().map(CacheSet::offset).collect();
    let mut rows: Vec<BatchRow<'_>> = cases
        .iter()
        .zip(batch_caches.iter_mut())
        .map(|(c, caches)| BatchRow {
            tokens: &c.window,
            caches,
            form: c.form,
        })
        .collect();
    let out = model.forward_batch(&mut rows, taps).expect("forward_batch");
    drop(rows);
    let total: usize = cases.iter().map(|c| c.window.len()).sum();
    assert_eq!(out.hidden.shape()[1] as usize, total, "packed length");
    let logits = model.logits(&out.hidden).expect("logits");
    let mut row_hidden = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let span = out.spans[i].clone();
        assert_eq!(span.len(), case.window.len(), "row {i}: span");
        let alone = run_alone(model, case, &mut alone_caches[i], taps);
        let hidden = host(&out.row_hidden(i).expect("row"));
        assert_eq!(hidden, host(&alone.hidden), "row {i}: hidden states");
        match (out.row_taps(i), &alone.taps) {
            (Some(b), Some(a)) => assert_eq!(host(&b), host(a), "row {i}: taps"),
            (None, None) => {}
            _ => panic!("row {i}: taps present in one run only"),
        }
        use mlx_rs::ops::indexing::IndexOp;
        let batch_logits = logits.index((.., span.start as i32..span.end as i32, ..));
        assert_eq!(
            host(&batch_logits),
            host(&model.logits(&alone.hidden).expect("logits")),
            "row {i}: logits"
        );
        assert_eq!(
            batch_caches[i].offset(),
            before[i] + case.window.len(),
            "row {i}: offset after the batch"
        );
        assert_eq!(batch_caches[i].offset(), alone_caches[i].offset());
        let next = [(i as u32 * 11 + 2) % 90];
        let a = model
            .decode(&ids(&next), &mut alone_caches[i], &[])
            .expect("next");
        let b = model
            .decode(&ids(&next), &mut batch_caches[i], &[])
            .expect("next");
        assert_eq!(
            host(&b.hidden),
            host(&a.hidden),
            "row {i}: the step after the batch"
        );
        row_hidden.push(hidden);
    }
    // Rows 0 and 4 share their window at different offsets: a forward that
    // shared positions or keys across rows could not tell them apart.
    if let (Some(a), Some(b)) = (row_hidden.first(), row_hidden.get(4)) {
        assert_ne!(a, b, "the same window at two offsets");
    }
}

/// `decode_rows` over lazy ids (the previous step's output, never read
/// back) gives `forward_batch`'s bits over the same one-token rows, and
/// leaves the caches where it does; a wrong ids shape is an error.
pub(crate) fn check_decode_rows(model: &dyn Target) {
    let cases = decoding(5, 1);
    let mut eager: Vec<CacheSet> = cases.iter().map(|c| prepared(model, c)).collect();
    let mut lazy: Vec<CacheSet> = cases.iter().map(|c| prepared(model, c)).collect();
    let tokens: Vec<u32> = cases.iter().map(|c| c.window[0]).collect();
    let mut rows: Vec<BatchRow<'_>> = cases
        .iter()
        .zip(eager.iter_mut())
        .map(|(c, caches)| BatchRow {
            tokens: &c.window,
            caches,
            form: RowForm::Decode,
        })
        .collect();
    let want = model.forward_batch(&mut rows, &[]).expect("forward_batch");
    drop(rows);
    // Ids computed by a graph, as a sampler's output is.
    let ids = Array::from_slice(&tokens, &[1, tokens.len() as i32])
        .add(Array::from_slice(&[0u32], &[1]))
        .expect("lazy ids");
    let mut refs: Vec<&mut CacheSet> = lazy.iter_mut().collect();
    let got = model.decode_rows(&ids, &mut refs).expect("decode_rows");
    let wrong = Array::from_slice(&tokens[..2], &[1, 2]);
    let err = model.decode_rows(&wrong, &mut refs).expect_err("shape");
    assert!(err.to_string().contains("decoding rows"), "{err}");
    drop(refs);
    assert_eq!(got.spans, want.spans, "spans");
    assert_eq!(host(&got.hidden), host(&want.hidden), "hidden states");
    for (i, (a, b)) in eager.iter().zip(&lazy).enumerate() {
        assert_eq!(a.offset(), b.offset(), "row {i}: offset");
    }
}

/// The batch errors every architecture reports before touching a cache.
pub(crate) fn check_errors(model: &dyn Target) {
    let mut a = prepared(model, &Case::new(1..5, &[], RowForm::Prefill));
    let mut b = model.make_caches();
    let err = model.forward_batch(&mut [], &[]).expect_err("empty batch");
    assert!(
        matches!(err, SpecError::Input(InputError::EmptyBatch)),
        "{err}"
    );
    let mut rows = [
        BatchRow {
            tokens: &[1, 2],
            caches: &mut a,
            form: RowForm::Decode,
        },
        BatchRow {
            tokens: &[],
            caches: &mut b,
            form: RowForm::Prefill,
        },
    ];
    let err = model
        .forward_batch(&mut rows, &[])
        .expect_err("zero tokens");
    assert!(
        matches!(err, SpecError::Input(InputError::EmptyRow { row: 1 })),
        "{err}"
    );
    let layers = model.info().num_layers;
    let err = model
        .forward_batch(&mut rows[..1], &[layers])
        .expect_err("tap");
    assert!(
        matches!(
            err,
            SpecError::Input(InputError::TapOutOfRange { index, .. }) if index == layers
        ),
        "{err}"
    );
    let mut wrong = CacheSet::new(Vec::new());
    let mut rows = [
        BatchRow {
            tokens: &[1, 2],
            caches: &mut a,
            form: RowForm::Decode,
        },
        BatchRow {
            tokens: &[3],
            caches: &mut wrong,
            form: RowForm::Decode,
        },
    ];
    let err = model.forward_batch(&mut rows, &[]).expect_err("caches");
    assert!(
        matches!(
            err,
            SpecError::Input(InputError::CacheCount {
                row: Some(1),
                got: 0,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("row 1: 0 caches"), "{err}");
    assert_eq!(
        (a.offset(), b.offset()),
        (4, 0),
        "a refused batch touches no cache"
    );
}

/// `src` quantized to 4 bits, group 32, into `dir/q4`; modules for which
/// `keep` holds stay float.
pub(crate) fn quantized(src: &Path, dir: &Path, keep: fn(&str) -> bool) -> std::path::PathBuf {
    let out = dir.join("q4");
    let mut options = QuantizeOptions::new(QuantParams::affine(32, 4));
    options.predicate = Some(Arc::new(move |module: &str| {
        if keep(module) {
            ModuleChoice::Exclude
        } else {
            ModuleChoice::Quantize
        }
    }));
    quantize_dir(src, &out, &options).expect("quantize");
    out
}
