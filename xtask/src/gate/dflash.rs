//! `cargo xtask gate dflash`: the `dflash` provider (z-lab's DFlash drafter,
//! layout `spec_fixtures::dflash`) on the synthetic llama and qwen3 targets.
//!
//! Each case runs `dflash_trace` once (plain and speculative greedy decoding
//! over the same prompts) and checks both:
//!
//! - Oracle: every round's drafts equal those of z-lab's own `model_mlx.py`
//!   (`xtask/python/oracle_dflash.py`) replaying the target taps our run
//!   recorded, on the same files and libmlx; full blocks and the shorter
//!   last blocks a request's token budget leaves.
//! - Lossless: speculative greedy output with `dflash` equals plain greedy
//!   output on every prompt.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use run_protocol::dflash::DflashRequest;
use run_protocol::dspark::{DsparkReplay, DsparkTrace};
use spec_fixtures::dflash::{self, Dflash};

use super::{suite, Counts};
use crate::synth::{self, is_current, replace_dir};
use crate::{runs, shell, venv};

const ORACLE: &str = "xtask/python/oracle_dflash.py";
const PROMPTS: usize = 6;
/// Not a multiple of a block: requests end on shorter blocks.
const MAX_TOKENS: usize = 19;
/// The drafter every case runs: both targets have its widths.
const DRAFTER: Dflash = dflash::GATE_LLAMA;
/// Bump when what gets written changes beyond the drafter's config.
const GENERATOR_VERSION: u32 = 1;

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let models = synth::ensure(&python)?;
    let drafter = drafter()?;
    let work = shell::root().join("target").join("gate-dflash");
    let prompts = suite::id_prompts(DRAFTER.vocab as u64, PROMPTS);
    let mut counts = Counts::default();
    for name in ["llama", "qwen3"] {
        let target = models
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("the synthetic {name} target is missing"))?;
        let dir = work.join(name);
        let ours = trace(&target, &drafter, &prompts, &dir)?;
        counts += lossless(&ours, name);
        counts += oracle(&python, &target, &drafter, &dir, &ours, name)?;
    }
    println!(
        "dflash: {} of {} checks passed",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// The synthetic drafter on disk, written when missing or stale.
fn drafter() -> Result<PathBuf> {
    let dir = synth::models_dir().join(DRAFTER.name);
    let stamp = format!(
        "generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
        DRAFTER.seed,
        DRAFTER.config()
    );
    if !is_current(&dir, &stamp) {
        eprintln!("generating synthetic DFlash drafter {}", dir.display());
        replace_dir(&dir, &stamp, |tmp| Ok(DRAFTER.write(tmp)?))?;
    }
    Ok(dir)
}

/// Runs `dflash_trace` with a draft count of a whole block; the trace is
/// saved as `DIR/trace.json` beside `DIR/taps.safetensors`.
fn trace(target: &Path, drafter: &Path, prompts: &[Vec<u32>], dir: &Path) -> Result<DsparkTrace> {
    shell::build()?;
    let request = DflashRequest {
        target: target.to_owned(),
        drafter: drafter.to_owned(),
        prompts: prompts.to_vec(),
        num_draft: DRAFTER.block_size - 1,
        max_tokens: MAX_TOKENS,
        taps: dir.join("taps.safetensors"),
    };
    runs::example(&request, &dir.join("trace"), &[])
}

/// Speculative output equals plain output on every prompt, and drafts were
/// proposed.
fn lossless(t: &DsparkTrace, label: &str) -> Counts {
    let identical = t
        .requests
        .iter()
        .filter(|r| r.tokens == r.plain_tokens && !r.tokens.is_empty())
        .count();
    let (drafted, accepted) = t
        .requests
        .iter()
        .fold((0, 0), |(x, y), r| (x + r.drafted, y + r.accepted));
    println!(
        "dflash lossless {label:<6}: {identical}/{} prompts identical to plain greedy, {drafted} drafted, {accepted} accepted",
        t.requests.len(),
    );
    for (i, r) in t
        .requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.tokens != r.plain_tokens)
    {
        eprintln!(
            "dflash lossless {label}: prompt {i}:\n  dflash {:?}\n  plain  {:?}",
            r.tokens, r.plain_tokens
        );
    }
    let ok = identical == t.requests.len() && drafted > 0;
    Counts {
        passed: u64::from(ok),
        failed: u64::from(!ok),
    }
}

/// The oracle's replay of our trace; passes when every round matches and
/// both full and shortened blocks were drafted.
fn oracle(
    python: &Path,
    target: &Path,
    drafter: &Path,
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
            .arg("--target")
            .arg(target)
            .arg("--trace")
            .arg(dir)
            .arg("--out")
            .arg(&out),
    )?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let theirs: DsparkReplay =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", out.display()))?;
    if ours.requests.len() != theirs.requests.len() {
        bail!(
            "{label}: the oracle replayed {} requests of {}",
            theirs.requests.len(),
            ours.requests.len()
        );
    }
    let full = DRAFTER.block_size - 1;
    let (mut rounds, mut equal, mut full_blocks, mut short_blocks) = (0, 0, 0, 0);
    let mut same_shape = true;
    for (i, (a, b)) in ours.requests.iter().zip(&theirs.requests).enumerate() {
        if a.rounds.len() != b.rounds.len() {
            same_shape = false;
            eprintln!(
                "dflash oracle {label}: request {i}: {} rounds, oracle {}",
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
                    "dflash oracle {label}: request {i} round {j}:\n  ours   {x:?}\n  oracle {y:?}"
                );
            }
            full_blocks += usize::from(x.block.len() == full);
            short_blocks += usize::from(x.block.len() < full);
        }
    }
    println!("dflash oracle   {label:<6}: {equal}/{rounds} rounds identical ({full_blocks} full blocks, {short_blocks} shortened)");
    let exercised = full_blocks > 0 && short_blocks > 0;
    if !exercised {
        eprintln!("dflash oracle {label}: the case did not draft both full and shortened blocks");
    }
    let ok = same_shape && equal == rounds && exercised;
    Ok(Counts {
        passed: u64::from(ok),
        failed: u64::from(!ok),
    })
}
