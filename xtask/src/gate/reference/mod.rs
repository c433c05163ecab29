//! The reference gate: our engine against the model publishers' reference
//! code, transformers 5.24 on torch (CPU), on checkpoints transformers
//! itself saved (`checkpoints.rs`: Hugging Face layout, float32).
//!
//! One Python process (`reference_lm.py`, in the environment of
//! `reference_env.rs`) decodes every prompt of every model greedily with
//! transformers' model and cache; our side is gate `parity`'s runner
//! (`parity_run`, release) on the same directories. Both write gate
//! `parity`'s output format. Per model: greedy tokens must be equal, or
//! differ only at a near tie (`compare.rs`), and the largest logit
//! difference over the steps both sides reached from the same tokens stays
//! within float32 rounding.
//!
//! The hybrids (Qwen3-Next, Qwen3.5 dense and MoE) run transformers' torch
//! Gated DeltaNet, the deterministic CPU path it falls back to without
//! flash-linear-attention and causal-conv1d (`reference_lm.py` refuses to
//! run if either is installed): `causal_conv1d_fn` and
//! `torch_chunk_gated_delta_rule` (chunks of 64 positions) over a prompt,
//! `causal_conv1d_update` and `torch_recurrent_gated_delta_rule` for each
//! decoded token, on one thread; their conv and recurrent states live in
//! the `DynamicCache` the model returns. Our side runs the recurrence one
//! position at a time, as mlx-lm's ops path does.

mod checkpoints;
mod compare;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;
use spec_fixtures::rng::SplitMix64;

use super::parity::{read_output, read_program_output, run_ours, Prompts};
use super::Counts;
use crate::{reference_env, shell};
use checkpoints::{Spec, SPECS, VOCAB};
use compare::{compare, Comparison, FLIP_MARGIN, LOGIT_TOLERANCE};

/// Prompt lengths: one shorter than the indexer's top-k and the sliding
/// window (crossing both while generating), the others longer.
const PROMPT_LENGTHS: &[usize] = &[3, 17, 40, 75];
const MAX_TOKENS: usize = 40;
const PROMPT_SEED: u64 = 0x7265_6665_7265_6e63;

pub fn run() -> Result<Counts> {
    let python = reference_env::ensure()?;
    let dirs = checkpoints::ensure(&python)?;
    let work = shell::root().join("target").join("gate-reference");
    let prompts_path = work.join("prompts.json");
    std::fs::write(
        &prompts_path,
        serde_json::to_string(&Prompts {
            prompts: prompts(),
            max_tokens: MAX_TOKENS,
            kv_cache: None,
            max_kv_size: None,
            adapter_path: None,
            decoding: None,
        })?,
    )?;
    let prefix = |spec: &Spec, side: &str| work.join(format!("{}-{side}", spec.name));
    // No output of an earlier run may stand in for this one's.
    for spec in SPECS {
        for side in ["transformers", "ours"] {
            for ext in ["json", "safetensors"] {
                let _ = std::fs::remove_file(prefix(spec, side).with_extension(ext));
            }
        }
    }

    // Every model in one process: importing torch is the slow part.
    let t = Instant::now();
    let plan = work.join("run.json");
    let items: Vec<_> = SPECS
        .iter()
        .zip(&dirs)
        .map(|(spec, dir)| {
            json!({"model": dir, "prompts": prompts_path, "out": prefix(spec, "transformers")})
        })
        .collect();
    std::fs::write(&plan, json!({ "run": items }).to_string())?;
    let reference = shell::run(
        reference_env::python_command(&python)
            .arg(shell::root().join(checkpoints::SCRIPT))
            .arg(&plan),
    )
    .context("the transformers reference failed");
    let reference_seconds = t.elapsed().as_secs_f64();

    let built =
        shell::build().context("our runner (spec-models example parity_run) does not build");
    let mut rows = Vec::new();
    for (spec, dir) in SPECS.iter().zip(&dirs) {
        eprintln!("\n== reference: {} ({})", spec.name, dir.display());
        let t = Instant::now();
        let outcome = match (&reference, &built) {
            (Err(e), _) | (_, Err(e)) => Err(anyhow::anyhow!("{e:#}")),
            (Ok(()), Ok(())) => check(dir, &prefix(spec, "transformers"), &prefix(spec, "ours")),
        };
        if let Err(e) = &outcome {
            eprintln!("reference: {}: {e:#}", spec.name);
        }
        rows.push(Row {
            name: spec.name,
            outcome,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    println!("\n{}", table(&rows, reference_seconds));
    let passed = rows.iter().filter(|r| r.passed()).count() as u64;
    println!("reference: {passed} of {} models pass", rows.len());
    Ok(Counts {
        passed,
        failed: rows.len() as u64 - passed,
    })
}

/// Runs our side on one checkpoint and compares it with the reference's
/// output (already written under `reference`).
fn check(dir: &Path, reference: &Path, ours: &Path) -> Result<Comparison> {
    let (logits, report) = run_ours(dir, prompts(), MAX_TOKENS, ours, (None, None), None, None)?;
    let (n, vocab) = (PROMPT_LENGTHS.len(), VOCAB as usize);
    let r =
        read_program_output(reference, n, MAX_TOKENS, vocab).context("the reference's output")?;
    let o = read_output(report, &logits, n, MAX_TOKENS, vocab).context("our runner's output")?;
    Ok(compare(&r, &o, vocab))
}

/// Deterministic prompts of `PROMPT_LENGTHS`, ids uniform in the vocabulary.
fn prompts() -> Vec<Vec<u32>> {
    PROMPT_LENGTHS
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut rng = SplitMix64::keyed(PROMPT_SEED, &format!("prompt {i}"));
            (0..len).map(|_| rng.below(VOCAB) as u32).collect()
        })
        .collect()
}

struct Row {
    name: &'static str,
    outcome: Result<Comparison>,
    seconds: f64,
}

impl Row {
    fn passed(&self) -> bool {
        matches!(&self.outcome, Ok(c) if c.passed())
    }
}

fn table(rows: &[Row], reference_seconds: f64) -> String {
    let mut out = format!(
        "{:<30} | {:<7} | {:<12} | {:<16} | {:<6} | ours s\n",
        "model", "prompts", "tokens equal", "max |logit diff|", "result"
    );
    let _ = writeln!(out, "{}", "-".repeat(90));
    let mut notes = String::new();
    for r in rows {
        let (equal, diff) = match &r.outcome {
            Ok(c) => (
                format!("{}/{}", c.runs_equal, c.runs),
                format!("{:.3e}", c.max_abs_diff),
            ),
            Err(_) => ("error".to_owned(), "-".to_owned()),
        };
        let result = if r.passed() { "pass" } else { "FAIL" };
        let _ = writeln!(
            out,
            "{:<30} | {:<7} | {equal:<12} | {diff:<16} | {result:<6} | {:.1}",
            r.name,
            PROMPT_LENGTHS.len(),
            r.seconds
        );
        match &r.outcome {
            Err(e) => {
                let _ = writeln!(notes, "{}: {e:#}", r.name);
            }
            Ok(c) => {
                for f in &c.flips {
                    let _ = writeln!(
                        notes,
                        "{}: prompt {} (length {}) step {}: transformers {} vs ours {}; top-2 margin {:.3e} (transformers), {:.3e} (ours): {}",
                        r.name,
                        f.run,
                        PROMPT_LENGTHS[f.run],
                        f.step,
                        f.reference,
                        f.ours,
                        f.reference_margin,
                        f.our_margin,
                        if f.explained() {
                            format!("a near tie (both under {FLIP_MARGIN:e}), rounding")
                        } else {
                            format!("NOT a near tie (limit {FLIP_MARGIN:e})")
                        }
                    );
                }
                if c.max_abs_diff > LOGIT_TOLERANCE {
                    let _ = writeln!(
                        notes,
                        "{}: logits differ by {:.3e}, more than float32 rounding ({LOGIT_TOLERANCE:e})",
                        r.name, c.max_abs_diff
                    );
                }
            }
        }
    }
    let _ = write!(
        out,
        "{notes}transformers (all models, one process): {reference_seconds:.1} s\n\
         note: two frameworks in float32: logits differ by rounding (up to {LOGIT_TOLERANCE:e} allowed); \
         tokens must be equal, or flip only where both sides' top-2 margin is under {FLIP_MARGIN:e}"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_deterministic_in_range_and_of_every_length() {
        let p = prompts();
        assert_eq!(p.iter().map(Vec::len).collect::<Vec<_>>(), PROMPT_LENGTHS);
        assert!(p.iter().flatten().all(|&t| u64::from(t) < VOCAB));
        assert_eq!(p, prompts());
    }
}
