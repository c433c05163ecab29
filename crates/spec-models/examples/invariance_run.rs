//! The engine side of `cargo xtask gate invariance`: a row's hidden state and
//! logits must not depend on how many rows share the forward pass.
//!
//! `invariance_run REQUEST.json` (a `run_protocol::invariance::InvarianceRequest`)
//! prefills a fixed pseudo-random prompt of `prompt_len` tokens, then computes
//! the next `rows` tokens' rows one forward per row (the reference: plain
//! decoding), and again as windows of 2..=rows rows from the same prefix
//! (verify windows), both through `Target::decode` as the serve loop runs
//! them; after each window it trims the caches back to the window's first
//! row (where they can trim that far) and decodes the second row alone
//! again, as a round that rejected its drafts continues. It reports the
//! rows that differ (`InvarianceReport`, on standard output) and writes the reference rows' hidden states then
//! logits, float32 little-endian, to the request's `bits` file, which the
//! gate compares across BLAS thread counts.

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use run_protocol::invariance::{InvarianceReport, InvarianceRequest, WindowRow};
use spec_core::Target;
use spec_models::{load_model, DtypePolicy, LoadOptions};

/// Fixed pseudo-random token ids below `vocab` (an LCG: no RNG crate needed).
fn tokens(count: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Hidden states and logits of the last `rows` positions, float32 bits per row.
fn rows_of(model: &dyn Target, hidden: &Array) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
    let logits = model.logits(hidden)?;
    let length = hidden.shape()[1];
    let bits = |a: &Array| -> Result<Vec<u32>> {
        let flat = a.as_dtype(Dtype::Float32)?.reshape(&[-1])?;
        Ok(flat.as_slice::<f32>().iter().map(|v| v.to_bits()).collect())
    };
    (0..length)
        .map(|i| {
            Ok((
                bits(&hidden.index((.., i, ..)))?,
                bits(&logits.index((.., i, ..)))?,
            ))
        })
        .collect()
}

fn prefilled(model: &dyn Target, prompt: &[u32]) -> Result<spec_core::CacheSet> {
    let mut caches = model.make_caches();
    let out = model.forward(&ids(prompt), &mut caches, &[])?;
    out.hidden.eval()?;
    Ok(caches)
}

fn main() -> Result<()> {
    let args: InvarianceRequest = run_protocol::read_request()?;
    if args.prompt_len == 0 || args.rows == 0 {
        bail!("invariance_run: prompt_len and rows must be at least 1");
    }
    let model = load_model(
        &args.model,
        &LoadOptions {
            dtype: match args.dtype {
                run_protocol::Dtype::F32 => DtypePolicy::Float32,
                run_protocol::Dtype::Keep => DtypePolicy::Keep,
            },
            ..LoadOptions::default()
        },
    )?;
    let vocab = model.info().vocab_size;
    let prompt = tokens(args.prompt_len, vocab, 0x696e_7661_7269);
    let next = tokens(args.rows, vocab, 0x726f_7773);

    // Plain decoding: one row per forward.
    let mut caches = prefilled(&model, &prompt)?;
    let mut reference = Vec::with_capacity(args.rows);
    for token in &next {
        let out = model.decode(&ids(&[*token]), &mut caches, &[])?;
        reference.extend(rows_of(&model, &out.hidden)?);
    }
    // Verify windows of every size from the same prefix.
    let mut mismatches = Vec::new();
    let (mut rollbacks, mut rolled_back) = (0, Vec::new());
    for window in 2..=args.rows {
        let mut caches = prefilled(&model, &prompt)?;
        let out = model.decode(&ids(&next[..window]), &mut caches, &[])?;
        for (row, got) in rows_of(&model, &out.hidden)?.iter().enumerate() {
            if got != &reference[row] {
                mismatches.push(WindowRow { window, row });
            }
        }
        // Rejected drafts: keep the first row, drop the rest, decode the
        // second row again alone (a recurrent layer restores its states).
        if caches.can_trim_after(0, window - 1) {
            caches.trim(window - 1)?;
            let out = model.decode(&ids(&next[1..2]), &mut caches, &[])?;
            rollbacks += 1;
            if rows_of(&model, &out.hidden)?.first() != Some(&reference[1]) {
                rolled_back.push(window);
            }
        }
    }
    let mut bytes = Vec::new();
    for (hidden, logits) in &reference {
        for v in hidden.iter().chain(logits) {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(&args.bits, bytes)?;
    run_protocol::write_report::<InvarianceRequest>(&InvarianceReport {
        rows: args.rows,
        mismatches,
        rollbacks,
        rolled_back_mismatches: rolled_back,
        gemm: mlx_sys_gemm(),
    })?;
    Ok(())
}

fn mlx_sys_gemm() -> String {
    mlx_ext::runtime::info()
        .gemm
        .unwrap_or_else(|| "the BLAS's own".to_owned())
}
