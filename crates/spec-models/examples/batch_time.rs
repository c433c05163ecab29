//! Times `Target::forward_batch` against the same rows run one after
//! another, for `cargo xtask bench batch-forward`: each of `rows` requests
//! is prefilled to its own offset (`offset` plus its index, different
//! prompts), then decoding steps of that many rows of each `windows` entry
//! (`mixed`: each row its own length, as prompt lookup's verify windows of
//! 1 + 0..16 drafts, [`MIXED`] in turn) run packed and one by one, each
//! step's logits evaluated and every row rolled back afterwards; the median
//! and the fastest of `repeats` steps are reported per shape (on a shared
//! machine the fastest step shows the cost without the neighbours' load).
//!
//! `batch_time REQUEST.json`: a `run_protocol::timing::BatchTimeRequest`;
//! reports a `BatchTimeReport` on standard output.

use std::time::Instant;

use anyhow::{bail, Result};
use mlx_rs::Array;
use run_protocol::timing::{BatchStep, BatchTimeReport, BatchTimeRequest, Windows};
use spec_core::{BatchRow, CacheSet, RowForm, Target};
use spec_models::{load_model, LoadOptions};

/// The rows' window lengths of `mixed`, row `r` taking entry `r % 8`.
const MIXED: [usize; 8] = [1, 17, 5, 1, 9, 3, 12, 2];

/// Row `row`'s window length.
fn window_len(windows: Windows, row: usize) -> usize {
    match windows {
        Windows::Each(n) => n,
        Windows::Mixed => MIXED[row % MIXED.len()],
    }
}

/// Median and fastest, in ms.
fn stats(mut times: Vec<f64>) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (1e3 * times[times.len() / 2], 1e3 * times[0])
}

fn main() -> Result<()> {
    let BatchTimeRequest {
        model,
        rows,
        windows,
        offset,
        repeats,
        kv_cache,
    } = run_protocol::read_request()?;
    if repeats == 0 || offset == 0 || rows.contains(&0) || windows.contains(&Windows::Each(0)) {
        bail!("batch_time: offset, repeats, rows and window lengths must be at least 1");
    }
    let options = LoadOptions {
        kv_quantization: kv_cache
            .map(|kv| spec_runtime::cache::KvQuantization::new(kv.bits, kv.group_size, kv.start))
            .transpose()?,
        ..LoadOptions::default()
    };
    let model = load_model(&model, &options)?;
    let vocab = model.info().vocab_size as u32;
    let tokens = |n: usize, from: u32| -> Vec<u32> {
        (0..n as u32).map(|i| (from + 7919 * i) % vocab).collect()
    };
    let most = rows.iter().copied().max().unwrap_or(1);
    let mut caches: Vec<CacheSet> = Vec::with_capacity(most);
    for r in 0..most {
        let mut c = model.make_caches();
        let prompt = tokens(offset + r, 11 + 31 * r as u32);
        model
            .forward(
                &Array::from_slice(&prompt, &[1, prompt.len() as i32]),
                &mut c,
                &[],
            )?
            .hidden
            .eval()?;
        caches.push(c);
    }
    let mut steps = Vec::new();
    for &n in &rows {
        for &w in &windows {
            let (mut packed, mut alone) = (Vec::new(), Vec::new());
            for rep in 0..=repeats {
                let steps: Vec<Vec<u32>> = (0..n)
                    .map(|r| tokens(window_len(w, r), 101 + (rep * n + r) as u32))
                    .collect();
                let start = Instant::now();
                let mut batch: Vec<BatchRow<'_>> = steps
                    .iter()
                    .zip(caches.iter_mut())
                    .map(|(t, c)| BatchRow {
                        tokens: t,
                        caches: c,
                        form: RowForm::Decode,
                    })
                    .collect();
                let out = model.forward_batch(&mut batch, &[])?;
                model.logits(&out.hidden)?.eval()?;
                let t_packed = start.elapsed().as_secs_f64();
                drop(batch);
                for (r, c) in caches.iter_mut().take(n).enumerate() {
                    c.trim(window_len(w, r))?;
                }
                let start = Instant::now();
                for (t, c) in steps.iter().zip(caches.iter_mut()) {
                    let ids = Array::from_slice(t, &[1, t.len() as i32]);
                    let out = model.decode(&ids, c, &[])?;
                    model.logits(&out.hidden)?.eval()?;
                }
                let t_alone = start.elapsed().as_secs_f64();
                for (r, c) in caches.iter_mut().take(n).enumerate() {
                    c.trim(window_len(w, r))?;
                }
                if rep > 0 {
                    // The first step warms up.
                    packed.push(t_packed);
                    alone.push(t_alone);
                }
            }
            let ((packed_ms, packed_min_ms), (alone_ms, alone_min_ms)) =
                (stats(packed), stats(alone));
            steps.push(BatchStep {
                rows: n,
                windows: w,
                packed_ms,
                alone_ms,
                packed_min_ms,
                alone_min_ms,
            });
        }
    }
    run_protocol::write_report::<BatchTimeRequest>(&BatchTimeReport { steps })?;
    Ok(())
}
