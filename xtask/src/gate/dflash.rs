//! `cargo xtask gate dflash`: the `dflash` provider (z-lab's DFlash drafter,
//! layout `spec_fixtures::dflash`) on the synthetic llama, qwen3, hybrid
//! qwen3-5 (Gated DeltaNet layers, the multimodal layout) and gemma4-text
//! (embeddings scaled by `sqrt(hidden)`, a softcapped head) targets.
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
//!
//! The random drafter's drafts are all rejected on those targets; a third
//! case, a llama of 6 tokens with a drafter of that vocabulary, accepts some
//! (rounds that keep several verified rows, the replay's and the
//! rollback's partial case).
//!
//! Two DFlash2 cases (`DFlash2DraftModel`: grouped dynamic causal
//! convolutions, the candidate selector's chain) whose second layer slides
//! (window [`WINDOW`]), on the llama and on the llama of 6 tokens: their
//! rounds are compared while `model_mlx.py`'s rotating cache holds the
//! context in time order (the context fits the window, or the first block
//! after the prefill); later rounds are counted, and checked lossless only.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use run_protocol::dflash::DflashRequest;
use run_protocol::dspark::{DsparkReplay, DsparkTrace};
use spec_fixtures::dflash::{self, Dflash, Sliding, SMALL_DFLASH2};
use spec_fixtures::llama::{self, Llama};

use super::{suite, Counts};
use crate::synth::{self, is_current, replace_dir};
use crate::{runs, shell, venv};

const ORACLE: &str = "xtask/python/oracle_dflash.py";
const PROMPTS: usize = 6;
/// Not a multiple of a block: requests end on shorter blocks.
const MAX_TOKENS: usize = 19;
/// The drafter of the synthetic targets: both have its widths.
const DRAFTER: Dflash = dflash::GATE_LLAMA;
/// The drafter of the synthetic hybrid `qwen3-5` (4 layers, the fourth
/// full attention): taps a linear and the full layer.
const HYBRID_DRAFTER: Dflash = Dflash {
    name: "dflash-qwen3-5",
    taps: &[1, 3],
    target_layers: 4,
    ..DRAFTER
};
/// The drafter of the synthetic `gemma4-text` (4 layers, sliding and full;
/// the target's embeddings scaled by `sqrt(hidden)`, its head softcapped):
/// taps a sliding and the full layer.
const GEMMA4_DRAFTER: Dflash = Dflash {
    name: "dflash-gemma4-text",
    taps: &[1, 2],
    target_layers: 4,
    ..DRAFTER
};
/// Vocabulary of the accepting case.
const SMALL_VOCAB: usize = 6;
/// The accepting case's drafter, every layer causal over the block
/// (`is_causal: true`).
const SMALL_DRAFTER: Dflash = Dflash {
    name: "dflash-llama-v6",
    vocab: SMALL_VOCAB,
    mask_token: 5,
    is_causal: Some(true),
    ..DRAFTER
};
/// The accepting case's target.
const SMALL_TARGET: Llama = Llama {
    name: "llama-v6",
    vocab: SMALL_VOCAB,
    ..llama::GATE_LLAMA
};
/// `sliding_window` of the DFlash2 drafters' sliding layer: some prompts
/// fit it with the rounds that follow, some do not.
const WINDOW: usize = 36;
/// DFlash2 with a sliding second layer, for the synthetic llama.
const DFLASH2_DRAFTER: Dflash = Dflash {
    name: "dflash2-llama",
    dflash2: Some(SMALL_DFLASH2),
    sliding: Some(Sliding {
        window: WINDOW,
        layers: &[1],
    }),
    ..DRAFTER
};
/// The same for the accepting case's llama, its sliding layer not causal
/// over the block (`is_causal: false`).
const SMALL_DFLASH2_DRAFTER: Dflash = Dflash {
    name: "dflash2-llama-v6",
    vocab: SMALL_VOCAB,
    mask_token: 5,
    is_causal: Some(false),
    ..DFLASH2_DRAFTER
};
/// Bump when what gets written changes beyond the drafter's config.
const GENERATOR_VERSION: u32 = 1;

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    let mut models = synth::ensure(&python)?;
    models.extend(crate::synth_qwen3_next::ensure(
        &synth::models_dir(),
        &python,
    )?);
    models.extend(crate::synth_gemma4::ensure(&synth::models_dir(), &python)?);
    let synthetic = |name: &str| {
        models
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("the synthetic {name} target is missing"))
    };
    let write_drafter = |d: &Dflash| written(d.name, d.seed, &d.config(), |dir| Ok(d.write(dir)?));
    let small_target = written(
        SMALL_TARGET.name,
        SMALL_TARGET.seed,
        &SMALL_TARGET.config(),
        |d| Ok(SMALL_TARGET.write(d)?),
    )?;
    let work = shell::root().join("target").join("gate-dflash");
    let mut counts = Counts::default();
    for (label, target, drafter) in [
        ("llama", synthetic("llama")?, DRAFTER),
        ("qwen3", synthetic("qwen3")?, DRAFTER),
        ("qwen3-5", synthetic("qwen3-5")?, HYBRID_DRAFTER),
        ("gemma4", synthetic("gemma4-text")?, GEMMA4_DRAFTER),
        ("llama-v6", small_target.clone(), SMALL_DRAFTER),
        ("dflash2", synthetic("llama")?, DFLASH2_DRAFTER),
        ("dflash2-v6", small_target.clone(), SMALL_DFLASH2_DRAFTER),
    ] {
        let window = drafter.sliding.map(|s| s.window);
        let vocab = drafter.vocab;
        let prompts = suite::id_prompts(vocab as u64, PROMPTS);
        let dir = work.join(label);
        let drafter = write_drafter(&drafter)?;
        let ours = trace(&target, &drafter, &prompts, &dir)?;
        counts += lossless(&ours, label, vocab == SMALL_VOCAB);
        counts += oracle(&python, &target, &drafter, &dir, &ours, label, window)?;
    }
    println!(
        "dflash: {} of {} checks passed",
        counts.passed,
        counts.passed + counts.failed
    );
    Ok(counts)
}

/// A synthetic checkpoint `name` in the gate models, written by `write`
/// when missing or stale (its stamp: the generator, the seed, the config).
fn written(
    name: &str,
    seed: u64,
    config: &serde_json::Value,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let dir = synth::models_dir().join(name);
    let stamp = format!("generator {GENERATOR_VERSION}\nseed {seed:#x}\n{config}\n");
    if !is_current(&dir, &stamp) {
        eprintln!("generating synthetic checkpoint {}", dir.display());
        replace_dir(&dir, &stamp, write)?;
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
/// proposed (and, where `accepting`, some accepted and some rejected).
fn lossless(t: &DsparkTrace, label: &str, accepting: bool) -> Counts {
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
        "dflash lossless {label:<8}: {identical}/{} prompts identical to plain greedy, {drafted} drafted, {accepted} accepted",
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
    let exercised = drafted > 0 && (!accepting || (accepted > 0 && accepted < drafted));
    let ok = identical == t.requests.len() && exercised;
    Counts {
        passed: u64::from(ok),
        failed: u64::from(!ok),
    }
}

/// The oracle's replay of our trace; passes when every round compared
/// matches and both full and shortened blocks were drafted. With a sliding
/// `window`, a round is compared when its context fits the window or it is
/// a request's first; the case must have compared rounds whose block
/// reaches past the window, and rounds past it.
fn oracle(
    python: &Path,
    target: &Path,
    drafter: &Path,
    dir: &Path,
    ours: &DsparkTrace,
    label: &str,
    window: Option<usize>,
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
    let (mut masked, mut beyond) = (0, 0);
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
            if let Some(w) = window {
                if j > 0 && x.context_len >= w {
                    beyond += 1;
                    continue;
                }
                masked += usize::from(x.context_len + x.block.len() >= w);
            }
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
    let sliding = match window {
        Some(w) => format!(
            "; window {w}: {masked} blocks reach past it, {beyond} later rounds not compared"
        ),
        None => String::new(),
    };
    println!("dflash oracle   {label:<8}: {equal}/{rounds} rounds identical ({full_blocks} full blocks, {short_blocks} shortened{sliding})");
    let exercised =
        full_blocks > 0 && short_blocks > 0 && (window.is_none() || (masked > 0 && beyond > 0));
    if !exercised {
        eprintln!("dflash oracle {label}: the case did not draft both full and shortened blocks (and, sliding, blocks reaching past the window and rounds beyond it)");
    }
    let ok = same_shape && equal == rounds && exercised;
    Ok(Counts {
        passed: u64::from(ok),
        failed: u64::from(!ok),
    })
}
