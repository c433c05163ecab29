//! `cargo xtask gate dspark`: the `deepspec` provider (DSpark drafter) on the
//! synthetic llama and gemma4_text targets (the gemma4 prompts run past its
//! sliding window of 8).
//!
//! Each case runs `dspark_trace` once (plain and speculative greedy decoding
//! over the same prompts) and checks both:
//!
//! - Oracle: our drafts equal `xtask/python/oracle_dspark.py`'s bit for bit
//!   (every block's tokens, every confidence's f32 bits, the drafts kept after
//!   the cut) over every round of several requests, replayed from the target
//!   taps our run recorded; thresholds 0 and > 0, float and 4-bit drafters
//!   (the 4-bit one dequantized to float32 and kept packed).
//! - Lossless: speculative greedy output with `deepspec` equals plain greedy
//!   output on every prompt, float and 4-bit drafters, including a threshold
//!   that cuts every proposal to zero tokens.

use std::path::Path;

use anyhow::{bail, Context, Result};
use run_protocol::dspark::{DsparkRequest, DsparkTrace};
use run_protocol::Dtype;

use super::suite;
use super::Counts;
use crate::{runs, shell, synth_dspark, venv};

const ORACLE: &str = "xtask/python/oracle_dspark.py";
const PROMPTS: usize = 12;
const MAX_TOKENS: usize = 32;
/// A threshold that cuts some proposals short and some to nothing on the
/// synthetic drafters (their confidences spread around 0.5).
const CUT: f32 = 0.5;
/// A threshold above every confidence: every proposal is cut to 0 tokens.
const CUT_ALL: f32 = 0.999;

/// The oracle's replay of a trace (`oracle_dspark.py`).
type Replay = run_protocol::dspark::DsparkReplay;

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let d = synth_dspark::ensure(&python)?;
    let work = shell::root().join("target").join("gate-dspark");
    let prompts = suite::id_prompts(320, PROMPTS);
    let mut counts = Counts::default();
    // The random drafters on the targets; the fitted ones on the llama's
    // near-bigram copy they were fitted to (real acceptance) and on the
    // gemma4 target itself. `keep`: a 4-bit drafter run packed (quantized
    // matmuls) instead of dequantized to float32 (the default).
    let (l, g) = (&d.llama, &d.gemma4);
    for (label, target, drafter, threshold, keep) in [
        ("llama random t=0", &l.target, &l.random, 0.0, false),
        ("llama random t=0.5", &l.target, &l.random, CUT, false),
        ("llama fit t=0", &l.local_target, &l.fit, 0.0, false),
        (
            "llama fit-bf16 t=0",
            &l.local_target,
            &l.fit_bf16,
            0.0,
            false,
        ),
        ("llama fit-q4 t=0", &l.local_target, &l.fit_q4, 0.0, false),
        ("llama fit-q4 t=0.5", &l.local_target, &l.fit_q4, CUT, false),
        (
            "llama fit-q4 keep t=0.5",
            &l.local_target,
            &l.fit_q4,
            CUT,
            true,
        ),
        ("llama fit t=0.999", &l.local_target, &l.fit, CUT_ALL, false),
        ("gemma4 random t=0.5", &g.target, &g.random, CUT, false),
        ("gemma4 fit-bf16 t=0", &g.target, &g.fit_bf16, 0.0, false),
        ("gemma4 fit-q4 t=0", &g.target, &g.fit_q4, 0.0, false),
        ("gemma4 fit-q4 keep t=0.5", &g.target, &g.fit_q4, CUT, true),
        (
            "gemma4 fit-bf16 t=0.999",
            &g.target,
            &g.fit_bf16,
            CUT_ALL,
            false,
        ),
    ] {
        let dir = work.join(label.replace([' ', '='], "_"));
        let ours = trace(target, drafter, threshold, keep, &prompts, &dir, MAX_TOKENS)?;
        counts += lossless(&ours, threshold, label);
        counts += oracle(&python, drafter, threshold, keep, &dir, &ours, label)?;
    }
    println!(
        "dspark: {} of {} checks passed",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// Runs `dspark_trace` (dev profile: the example is thin over MLX, whose
/// crates the dev profile optimises) with a fixed draft count of the
/// drafters' block size; `keep` runs a quantized drafter packed. The trace
/// is saved as `DIR/trace.json` beside `DIR/taps.safetensors`, where the
/// oracle reads them.
pub fn trace(
    target: &Path,
    drafter: &Path,
    threshold: f32,
    keep: bool,
    prompts: &[Vec<u32>],
    dir: &Path,
    max_tokens: usize,
) -> Result<DsparkTrace> {
    shell::build()?;
    let request = DsparkRequest {
        target: target.to_owned(),
        drafter: drafter.to_owned(),
        drafter_dtype: if keep { Dtype::Keep } else { Dtype::F32 },
        threshold,
        prompts: prompts.to_vec(),
        num_draft: synth_dspark::BLOCK_SIZE,
        max_tokens,
        taps: dir.join("taps.safetensors"),
    };
    runs::example(&request, &dir.join("trace"), &[])
}

/// Speculative output equals plain output on every prompt, and the case
/// proposed drafts (or, cutting everything, none).
fn lossless(t: &DsparkTrace, threshold: f32, label: &str) -> Counts {
    let identical = t
        .requests
        .iter()
        .filter(|r| r.tokens == r.plain_tokens && !r.tokens.is_empty())
        .count();
    let (drafted, accepted) = t
        .requests
        .iter()
        .fold((0, 0), |(x, y), r| (x + r.drafted, y + r.accepted));
    let as_meant = if threshold >= CUT_ALL {
        drafted == 0
    } else {
        drafted > 0
    };
    println!(
        "dspark lossless {label:<24}: {identical}/{} prompts identical to plain greedy, {drafted} drafted, {:.1}% accepted{}",
        t.requests.len(),
        if drafted == 0 { 0.0 } else { 100.0 * accepted as f64 / drafted as f64 },
        if as_meant { "" } else { " (NOT exercised as intended)" }
    );
    for (i, r) in t
        .requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.tokens != r.plain_tokens)
    {
        eprintln!(
            "dspark lossless {label}: prompt {i}:\n  deepspec {:?}\n  plain    {:?}",
            r.tokens, r.plain_tokens
        );
    }
    let ok = identical == t.requests.len() && as_meant;
    Counts {
        passed: u64::from(ok),
        failed: u64::from(!ok),
    }
}

/// The oracle's replay of our trace; passes when every round matches and
/// the case exercised what it is meant to (drafts proposed; with a cutting
/// threshold, cuts that keep some tokens and cuts that keep none).
fn oracle(
    python: &Path,
    drafter: &Path,
    threshold: f32,
    keep: bool,
    dir: &Path,
    ours: &DsparkTrace,
    label: &str,
) -> Result<Counts> {
    let out = dir.join("oracle.json");
    shell::run(
        venv::python_command(python)
            .arg(shell::root().join(ORACLE))
            .arg("--drafter")
            .arg(drafter)
            .arg("--trace")
            .arg(dir)
            .args(["--threshold", &threshold.to_string()])
            .arg("--out")
            .arg(&out)
            .args(if keep { &["--keep"][..] } else { &[][..] }),
    )?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let theirs: Replay =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", out.display()))?;
    if ours.requests.len() != theirs.requests.len() {
        bail!(
            "{label}: the oracle replayed {} requests of {}",
            theirs.requests.len(),
            ours.requests.len()
        );
    }
    let (mut rounds, mut equal, mut drafted, mut partial, mut empty) = (0, 0, 0, 0, 0);
    let mut same_shape = true;
    for (i, (a, b)) in ours.requests.iter().zip(&theirs.requests).enumerate() {
        if a.rounds.len() != b.rounds.len() {
            same_shape = false;
            eprintln!(
                "dspark oracle {label}: request {i}: {} rounds, oracle {}",
                a.rounds.len(),
                b.rounds.len()
            );
        }
        for (j, (x, y)) in a.rounds.iter().zip(&b.rounds).enumerate() {
            rounds += 1;
            if x.proposal() == *y {
                equal += 1;
            } else {
                eprintln!(
                    "dspark oracle {label}: request {i} round {j}:\n  ours   {x:?}\n  oracle {y:?}"
                );
            }
            drafted += x.drafts.len();
            partial += usize::from(!x.drafts.is_empty() && x.drafts.len() < x.block.len());
            empty += usize::from(x.drafts.is_empty());
        }
    }
    let exercised = rounds > 0
        && if threshold >= CUT_ALL {
            drafted == 0
        } else if threshold > 0.0 {
            partial > 0 && empty > 0
        } else {
            drafted > 0
        };
    println!("dspark oracle   {label:<24}: {equal}/{rounds} rounds bit-identical ({drafted} drafts, {partial} rounds cut short, {empty} cut to zero)");
    if !exercised {
        eprintln!(
            "dspark oracle {label}: the case did not exercise drafting and cutting as intended"
        );
    }
    let ok = same_shape && equal == rounds && exercised;
    Ok(Counts {
        passed: u64::from(ok),
        failed: u64::from(!ok),
    })
}
