//! Times the target's forward over decoding windows, for `cargo xtask bench
//! decode`: after a prompt of `P` tokens, windows of each size in `--rows`
//! run through `Target::decode` (as the serve loop verifies drafts), each
//! rolled back afterwards; the median of `--repeats` runs per size is printed
//! as `window ROWS: MS ms`.
//!
//! `window_time --model DIR [--prompt-len P] [--rows 1,4,8,17] [--repeats N]`;
//! `window_time --describe` prints how this process computes float32 GEMMs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_rs::Array;
use spec_core::Target;
use spec_models::{load_model, LoadOptions};

fn main() -> Result<()> {
    let (mut model, mut prompt_len, mut rows, mut repeats) =
        (None, 64_usize, vec![1_usize, 4, 8, 17], 9_usize);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--describe" {
            println!(
                "{}",
                mlx_ext::runtime::info()
                    .gemm
                    .unwrap_or_else(|| "the BLAS's own".to_owned())
            );
            return Ok(());
        }
        let value = it.next().with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--model" => model = Some(PathBuf::from(value)),
            "--prompt-len" => prompt_len = value.parse().context("--prompt-len")?,
            "--rows" => {
                rows = value
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--rows")?
            }
            "--repeats" => repeats = value.parse().context("--repeats")?,
            other => bail!("unknown argument {other}"),
        }
    }
    let model = load_model(
        &model.context("--model is required")?,
        &LoadOptions::default(),
    )?;
    if prompt_len == 0 || repeats == 0 || rows.contains(&0) {
        bail!("--prompt-len, --repeats and every --rows entry must be at least 1");
    }
    let vocab = model.info().vocab_size as u32;
    let ids = |n: usize, from: u32| -> Array {
        let tokens: Vec<u32> = (0..n as u32).map(|i| (from + 7919 * i) % vocab).collect();
        Array::from_slice(&tokens, &[1, n as i32])
    };
    let mut caches = model.make_caches();
    model
        .forward(&ids(prompt_len, 11), &mut caches, &[])?
        .hidden
        .eval()?;
    for &size in &rows {
        if !caches.can_trim_after(size, size) {
            bail!("this model's caches cannot roll back a window of {size}");
        }
        let mut times = Vec::with_capacity(repeats);
        for r in 0..=repeats {
            let window = ids(size, 101 + r as u32);
            let start = Instant::now();
            let out = model.decode(&window, &mut caches, &[])?;
            model.logits(&out.hidden)?.eval()?;
            let elapsed = start.elapsed().as_secs_f64();
            caches.trim(size)?;
            if r > 0 {
                // The first run warms up.
                times.push(elapsed);
            }
        }
        times.sort_by(f64::total_cmp);
        println!("window {size}: {:.3} ms", 1e3 * times[times.len() / 2]);
    }
    Ok(())
}
