//! The engine side of `cargo xtask gate invariance`: a row's hidden state and
//! logits must not depend on how many rows share the forward pass.
//!
//! `invariance_run --model DIR --out PREFIX [--prompt-len P] [--rows R] [--dtype keep|f32]`
//! prefills a fixed pseudo-random prompt of `P` tokens, then computes the next
//! `R` tokens' rows one forward per row (the reference: plain decoding), and
//! again as windows of 2..=R rows from the same prefix (verify windows), both
//! through `Target::decode` as the serve loop runs them. It
//! writes `PREFIX.json` (`{"rows": R, "mismatches": [[window, row], ...]}`)
//! and `PREFIX.bin`: the reference rows' hidden states then logits, float32
//! little-endian, which the gate compares across BLAS thread counts.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::Target;
use spec_models::{load_model, DtypePolicy, LoadOptions};

struct Args {
    model: PathBuf,
    out: PathBuf,
    prompt_len: usize,
    rows: usize,
    dtype: DtypePolicy,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        model: PathBuf::new(),
        out: PathBuf::new(),
        prompt_len: 70,
        rows: 33,
        dtype: DtypePolicy::Keep,
    };
    let (mut model, mut out) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => model = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--prompt-len" => args.prompt_len = value()?.parse().context("--prompt-len")?,
            "--rows" => args.rows = value()?.parse().context("--rows")?,
            "--dtype" => {
                args.dtype = match value()?.as_str() {
                    "keep" => DtypePolicy::Keep,
                    "f32" => DtypePolicy::Float32,
                    other => bail!("--dtype {other}: expected keep or f32"),
                }
            }
            other => bail!("unknown argument {other}"),
        }
    }
    args.model = model.context("--model is required")?;
    args.out = out.context("--out is required")?;
    if args.prompt_len == 0 || args.rows == 0 {
        bail!("--prompt-len and --rows must be at least 1");
    }
    Ok(args)
}

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
    let args = parse_args()?;
    let model = load_model(
        &args.model,
        &LoadOptions {
            dtype: args.dtype,
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
    for window in 2..=args.rows {
        let mut caches = prefilled(&model, &prompt)?;
        let out = model.decode(&ids(&next[..window]), &mut caches, &[])?;
        for (row, got) in rows_of(&model, &out.hidden)?.iter().enumerate() {
            if got != &reference[row] {
                mismatches.push([window, row]);
            }
        }
    }
    let prefix = args.out.to_string_lossy().into_owned();
    let mut bytes = Vec::new();
    for (hidden, logits) in &reference {
        for v in hidden.iter().chain(logits) {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(format!("{prefix}.bin"), bytes)?;
    let report =
        serde_json::json!({ "rows": args.rows, "mismatches": mismatches, "gemm": mlx_sys_gemm() });
    std::fs::write(format!("{prefix}.json"), serde_json::to_string(&report)?)?;
    Ok(())
}

fn mlx_sys_gemm() -> String {
    mlx_ext::runtime::info()
        .gemm
        .unwrap_or_else(|| "the BLAS's own".to_owned())
}
