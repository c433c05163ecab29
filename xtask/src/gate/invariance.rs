//! `cargo xtask gate invariance`: a row's numerics do not depend on the batch.
//!
//! For every gate model, our runner (`spec-models` example `invariance_run`)
//! computes rows of plain decoding one forward each and again inside verify
//! windows of 2..=33 rows; every row must be bit-identical (hidden state and
//! logits), and so must the next row decoded after each window is rolled
//! back to its first row (a round rejecting its drafts: a recurrent layer
//! restores its states). The hybrid checkpoints (`qwen3-next`, `qwen3-5`,
//! Gated DeltaNet layers) run too. It runs once with one BLAS thread and once with two, and the two
//! runs' rows must be bit-identical too. A control run with our GEMM front
//! turned off (`MLX_SPEC_GEMM=blas`: OpenBLAS alone, as before the front) is
//! reported for information: on most machines it shows the failure the front
//! removes. The models' checks run side by side (`runs::parallel`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use run_protocol::invariance::{InvarianceReport, InvarianceRequest};
use run_protocol::Dtype;

use super::Counts;
use crate::runs::{self, with_suffix};
use crate::{real_model, shell, synth, venv};

const ROWS: usize = 33;
/// Longer than the front's row limit (64), so the prefill runs on OpenBLAS.
const PROMPT_LEN: usize = 70;

/// One run of the runner under `env` (request, report and rows under
/// `stem`); returns its report and the rows' bytes.
fn run_once(
    model: &Path,
    stem: &Path,
    env: &[(&str, &str)],
) -> Result<(InvarianceReport, Vec<u8>)> {
    let bits = with_suffix(stem, ".bin");
    let request = InvarianceRequest {
        model: model.to_owned(),
        dtype: Dtype::Keep,
        prompt_len: PROMPT_LEN,
        rows: ROWS,
        bits: bits.clone(),
    };
    let report = runs::example(&request, stem, env)?;
    if report.rows != ROWS {
        bail!(
            "{}: {} rows, expected {ROWS}",
            runs::report_file(stem).display(),
            report.rows
        );
    }
    let bytes = std::fs::read(&bits).with_context(|| format!("reading {}", bits.display()))?;
    Ok((report, bytes))
}

/// Checks one model; returns a one-line verdict (`Ok`) or what differed.
/// Gate `gguf` runs it on its quantized GGUF files too.
pub(super) fn check_model(model: &Path, work: &Path) -> Result<String> {
    std::fs::create_dir_all(work)?;
    let (one, one_bytes) = run_once(
        model,
        &work.join("threads1"),
        &[("OPENBLAS_NUM_THREADS", "1")],
    )?;
    let (two, two_bytes) = run_once(
        model,
        &work.join("threads2"),
        &[("OPENBLAS_NUM_THREADS", "2")],
    )?;
    let mut problems = Vec::new();
    for (threads, report) in [(1, &one), (2, &two)] {
        if let Some(window) = report.rolled_back_mismatches.first() {
            problems.push(format!(
                "{threads} thread(s): after {} of {} windows rolled back to their first row the next row differs from plain decoding (first: the {window}-row window)",
                report.rolled_back_mismatches.len(),
                report.rollbacks
            ));
        }
        if let Some(first) = report.mismatches.first() {
            problems.push(format!(
                "{threads} thread(s): {} of the window rows differ from plain decoding (first: row {} of the {}-row window; {})",
                report.mismatches.len(),
                first.row,
                first.window,
                report.gemm
            ));
        }
    }
    if one_bytes != two_bytes {
        problems.push("the rows differ between 1 and 2 BLAS threads".to_owned());
    }
    if problems.is_empty() {
        Ok(format!(
            "windows of 1..={ROWS} rows, 1 and 2 threads, {} rollbacks: identical ({})",
            two.rollbacks, two.gemm
        ))
    } else {
        bail!("{}", problems.join("; "))
    }
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let mut models: Vec<(String, PathBuf)> = synth::ensure(&python)?
        .into_iter()
        .map(|c| (c.name, c.dir))
        .collect();
    let hybrid = crate::synth_qwen3_next::ensure(&synth::models_dir(), &python)?;
    models.extend(hybrid.into_iter().map(|c| (c.name, c.dir)));
    // The real model first: its runs are the longest (`runs::parallel`
    // keeps the machine busy with the small models beside them).
    let real = real_model::ensure()?;
    models.insert(0, (real_model::NAME.to_owned(), real.clone()));
    shell::build().context("our runner (spec-models example invariance_run) does not build")?;
    let work = shell::root().join("target").join("gate-invariance");
    // The control, OpenBLAS alone on the real model, beside the checks.
    let control_job = {
        let (real, work) = (&real, &work);
        Box::new(move || {
            let (report, _) = run_once(
                real,
                &work.join("control-openblas"),
                &[("MLX_SPEC_GEMM", "blas")],
            )?;
            Ok(format!(
                "{} of the window rows differ from plain decoding on {} with OpenBLAS alone ({})",
                report.mismatches.len(),
                real_model::NAME,
                report.gemm
            ))
        }) as Box<dyn FnOnce() -> Result<String> + Send + '_>
    };
    let mut jobs = vec![control_job];
    for (name, dir) in &models {
        let model_work = work.join(name);
        jobs.push(Box::new(move || check_model(dir, &model_work)));
    }
    let mut verdicts = runs::parallel(jobs)?.into_iter();
    let control = match verdicts.next() {
        Some(Ok(line)) => line,
        Some(Err(e)) => format!("control run failed: {e:#}"),
        None => "control run missing".to_owned(),
    };
    let mut counts = Counts::default();
    let mut lines = Vec::new();
    for ((name, _), verdict) in models.iter().zip(verdicts) {
        match verdict {
            Ok(verdict) => {
                counts.passed += 1;
                lines.push(format!("{name:<20} ok    {verdict}"));
            }
            Err(e) => {
                counts.failed += 1;
                lines.push(format!("{name:<20} FAIL  {e:#}"));
            }
        }
    }
    println!(
        "\ninvariance (a row's hidden state and logits, alone vs in windows, 1 vs 2 threads):"
    );
    for line in &lines {
        println!("  {line}");
    }
    println!("  control: {control}");
    println!(
        "invariance: {} of {} models pass",
        counts.passed,
        models.len()
    );
    Ok(counts)
}
