//! `cargo xtask bench batch-forward`: one packed `Target::forward_batch`
//! over several requests' decoding rows against the same rows run one after
//! another (`Target::decode` each), on the real model: rows of 1 token
//! (plain decoding), of 4 (a verify window) and of mixed lengths (1 to 17:
//! prompt lookup's verify windows, `batch_time`'s `mixed`), 1, 4 and 8 requests at
//! offsets near 100, median ms per step and the ratio, then the fastest
//! step of each (on a shared machine, the cost without the neighbours' load).
//!
//! Options: `--model DIR` (default: SmolLM2-135M in float32), `--repeats N`
//! (steps per configuration, default 9), `--kv-bits B` (keys and values in
//! B bits, groups of 64, from the first position).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use run_protocol::timing::{BatchTimeRequest, Windows};
use run_protocol::KvCacheBits;

use crate::{real_model, runs, shell};

fn parse(args: &[String]) -> Result<(Option<PathBuf>, usize, Option<i32>)> {
    let (mut model, mut repeats, mut kv_bits) = (None, 9, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => model = Some(PathBuf::from(value()?)),
            "--repeats" => repeats = value()?.parse().context("--repeats")?,
            "--kv-bits" => kv_bits = Some(value()?.parse().context("--kv-bits")?),
            other => bail!("unknown option {other} (known: --model, --repeats, --kv-bits)"),
        }
    }
    if repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    Ok((model, repeats, kv_bits))
}

pub fn run(args: &[String]) -> Result<()> {
    let (model, repeats, kv_bits) = parse(args)?;
    let model = match model {
        Some(m) => m,
        None => real_model::ensure()?,
    };
    shell::run(shell::cargo().args([
        "build",
        "--release",
        "-q",
        "-p",
        "spec-models",
        "--example",
        "batch_time",
    ]))?;
    let request = BatchTimeRequest {
        model: model.clone(),
        rows: vec![1, 4, 8],
        windows: vec![Windows::Each(1), Windows::Each(4), Windows::Mixed],
        offset: 100,
        repeats,
        kv_cache: kv_bits.map(|bits| KvCacheBits {
            bits,
            group_size: 64,
            start: 0,
        }),
    };
    let work = shell::root().join("target").join("bench-batch-forward");
    let steps = runs::example(&request, &work.join("batch-time"), &[])?.steps;
    if steps.is_empty() {
        bail!("batch_time reported no steps");
    }
    println!(
        "\nbatched forward on {} (median of {repeats} steps, offsets 100+){}, CPU: {}",
        model.display(),
        kv_bits.map_or(String::new(), |b| format!(", keys and values in {b} bits")),
        super::cpu_model()
    );
    println!(
        "{:>5} {:>15} {:>10} {:>14} {:>7} {:>12} {:>12} {:>7}",
        "rows",
        "tokens per row",
        "packed ms",
        "one by one ms",
        "ratio",
        "best packed",
        "best 1-by-1",
        "ratio"
    );
    for s in steps {
        println!(
            "{:>5} {:>15} {:>10.2} {:>14.2} {:>6.2}x {:>12.2} {:>12.2} {:>6.2}x",
            s.rows,
            s.windows.to_string(),
            s.packed_ms,
            s.alone_ms,
            s.alone_ms / s.packed_ms,
            s.packed_min_ms,
            s.alone_min_ms,
            s.alone_min_ms / s.packed_min_ms
        );
    }
    println!("ratio: one by one / packed (above 1: the packed forward is faster)");
    Ok(())
}
