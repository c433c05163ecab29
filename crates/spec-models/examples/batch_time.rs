//! Times `Target::forward_batch` against the same rows run one after
//! another, for `cargo xtask bench batch-forward`: each of `--rows` requests
//! is prefilled to its own offset (`--offset` plus its index, different
//! prompts), then decoding steps of `ROWS` rows of `W` tokens (each of
//! `--windows`; `mixed`: each row its own length, as prompt lookup's verify
//! windows of 1 + 0..16 drafts, [`MIXED`] in turn) run packed and one by one, each step's logits evaluated and
//! every row rolled back afterwards; the median and the fastest of
//! `--repeats` steps are printed as `step ROWS x W: PACKED ms packed, ALONE
//! ms alone, best PACKED_MIN / ALONE_MIN ms` (on a shared machine the
//! fastest step shows the cost without the neighbours' load).
//!
//! `batch_time --model DIR [--rows 1,4,8] [--windows 1,4,mixed] [--offset 100] [--repeats N]`

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_rs::Array;
use spec_core::{BatchRow, CacheSet, RowForm, Target};
use spec_models::{load_model, LoadOptions};

/// The rows' window lengths of `--windows mixed`, row `r` taking entry
/// `r % 8`.
const MIXED: [usize; 8] = [1, 17, 5, 1, 9, 3, 12, 2];

/// A `--windows` entry: every row `n` tokens, or each its [`MIXED`] length.
#[derive(Clone, Copy)]
enum Windows {
    Each(usize),
    Mixed,
}

impl Windows {
    fn len(self, row: usize) -> usize {
        match self {
            Windows::Each(n) => n,
            Windows::Mixed => MIXED[row % MIXED.len()],
        }
    }
}

impl std::fmt::Display for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Windows::Each(n) => write!(f, "{n}"),
            Windows::Mixed => f.write_str("mixed"),
        }
    }
}

fn windows_list(value: &str) -> Result<Vec<Windows>> {
    value
        .split(',')
        .map(|w| match w {
            "mixed" => Ok(Windows::Mixed),
            n => match n.parse() {
                Ok(0) | Err(_) => bail!("--windows: {n:?} is neither a token count nor `mixed`"),
                Ok(n) => Ok(Windows::Each(n)),
            },
        })
        .collect()
}

fn list(value: &str, what: &str) -> Result<Vec<usize>> {
    value
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| what.to_owned())
}

/// Median and fastest, in ms.
fn stats(mut times: Vec<f64>) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (1e3 * times[times.len() / 2], 1e3 * times[0])
}

fn main() -> Result<()> {
    let (mut model, mut rows, mut windows, mut offset, mut repeats) = (
        None,
        vec![1_usize, 4, 8],
        vec![Windows::Each(1), Windows::Each(4)],
        100_usize,
        9_usize,
    );
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--model" => model = Some(PathBuf::from(value)),
            "--rows" => rows = list(&value, "--rows")?,
            "--windows" => windows = windows_list(&value)?,
            "--offset" => offset = value.parse().context("--offset")?,
            "--repeats" => repeats = value.parse().context("--repeats")?,
            other => bail!("unknown argument {other}"),
        }
    }
    if repeats == 0 || offset == 0 || rows.contains(&0) {
        bail!("--offset, --repeats and every --rows entry must be at least 1");
    }
    let model = load_model(
        &model.context("--model is required")?,
        &LoadOptions::default(),
    )?;
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
    for &n in &rows {
        for &w in &windows {
            let (mut packed, mut alone) = (Vec::new(), Vec::new());
            for rep in 0..=repeats {
                let steps: Vec<Vec<u32>> = (0..n)
                    .map(|r| tokens(w.len(r), 101 + (rep * n + r) as u32))
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
                    c.trim(w.len(r))?;
                }
                let start = Instant::now();
                for (t, c) in steps.iter().zip(caches.iter_mut()) {
                    let ids = Array::from_slice(t, &[1, t.len() as i32]);
                    let out = model.decode(&ids, c, &[])?;
                    model.logits(&out.hidden)?.eval()?;
                }
                let t_alone = start.elapsed().as_secs_f64();
                for (r, c) in caches.iter_mut().take(n).enumerate() {
                    c.trim(w.len(r))?;
                }
                if rep > 0 {
                    // The first step warms up.
                    packed.push(t_packed);
                    alone.push(t_alone);
                }
            }
            let ((packed, packed_min), (alone, alone_min)) = (stats(packed), stats(alone));
            println!(
                "step {n} x {w}: {packed:.3} ms packed, {alone:.3} ms alone, best {packed_min:.3} / {alone_min:.3} ms"
            );
        }
    }
    Ok(())
}
