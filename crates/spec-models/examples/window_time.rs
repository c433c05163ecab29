//! Times the target's forward over decoding windows, for `cargo xtask bench
//! decode`: after a prompt of `prompt_len` tokens, windows of each size in
//! `rows` run through `Target::decode` (as the serve loop verifies drafts),
//! each rolled back afterwards (and the rest committed, as the serve loop
//! does); the median of `repeats` runs per size (the forward, the rollback)
//! and the bytes the window added to the caches are reported with how this
//! process computes float32 GEMMs.
//!
//! `window_time REQUEST.json`: a `run_protocol::timing::WindowTimeRequest`
//! (`"describe"` only describes the GEMMs); reports a `WindowTimeReport` on
//! standard output.

use std::time::Instant;

use anyhow::{bail, Result};
use mlx_rs::Array;
use run_protocol::timing::{WindowTime, WindowTimeReport, WindowTimeRequest};
use spec_core::Target;
use spec_models::{load_model, LoadOptions};

fn main() -> Result<()> {
    let request: WindowTimeRequest = run_protocol::read_request()?;
    let gemm = mlx_ext::runtime::info()
        .gemm
        .unwrap_or_else(|| "the BLAS's own".to_owned());
    let WindowTimeRequest::Time {
        model,
        prompt_len,
        rows,
        repeats,
    } = request
    else {
        let report = WindowTimeReport {
            gemm,
            windows: Vec::new(),
        };
        run_protocol::write_report::<WindowTimeRequest>(&report)?;
        return Ok(());
    };
    if prompt_len == 0 || repeats == 0 || rows.contains(&0) {
        bail!("window_time: prompt_len, repeats and every rows entry must be at least 1");
    }
    let model = load_model(&model, &LoadOptions::default())?;
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
    // As the serve loop does before each step: the prompt is final.
    caches.commit_to(caches.offset());
    let mut windows = Vec::new();
    for &size in &rows {
        if !caches.can_trim_after(size, size) {
            bail!("this model's caches cannot roll back a window of {size}");
        }
        let mut times = Vec::with_capacity(repeats);
        let mut trims = Vec::with_capacity(repeats);
        let mut added_bytes = 0;
        for r in 0..=repeats {
            let window = ids(size, 101 + r as u32);
            let before = caches.nbytes();
            let start = Instant::now();
            let out = model.decode(&window, &mut caches, &[])?;
            model.logits(&out.hidden)?.eval()?;
            let elapsed = start.elapsed().as_secs_f64();
            added_bytes = caches.nbytes().saturating_sub(before);
            let start = Instant::now();
            caches.trim(size)?;
            let trimmed = start.elapsed().as_secs_f64();
            caches.commit_to(caches.offset());
            if r > 0 {
                // The first run warms up.
                times.push(elapsed);
                trims.push(trimmed);
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        windows.push(WindowTime {
            rows: size,
            ms: 1e3 * median(times),
            trim_us: 1e6 * median(trims),
            added_bytes,
        });
    }
    run_protocol::write_report::<WindowTimeRequest>(&WindowTimeReport { gemm, windows })?;
    Ok(())
}
