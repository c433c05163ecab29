//! `cargo xtask bench dflash`: the `dflash` provider with a synthetic DFlash
//! drafter of 16-token blocks (z-lab's default) on the near-bigram copy of
//! the synthetic llama target (`bench dspark`'s), random and trained on the
//! target's own greedy text (`xtask/python/fit_dflash.py`, z-lab's
//! `model_mlx.py` under MLX's autograd): acceptance, tokens per target
//! forward, wall time against plain greedy decoding of the same prompts in
//! the same process, and the drafter's block forward against one plain
//! target step.
//!
//! Options: `--prompts N` (default 24), `--max-tokens N` (default 64),
//! `--steps N` (training steps, default 2000). Rows: each drafter at 3, 7 and
//! 15 drafts a round (blocks of 4, 8 and 16).

use std::path::Path;

use anyhow::Result;

use super::fitted;
use run_protocol::dflash::DflashRequest;
use run_protocol::dspark::DsparkTrace;
use spec_fixtures::dflash::{self, Dflash};

use super::dspark::Measured;
use crate::gate::suite;
use crate::{runs, shell, synth, synth_dflash, synth_dspark, venv};

/// The benchmark's drafter: the gate's llama drafter with z-lab's block.
const DRAFTER: Dflash = Dflash {
    name: "dflash-llama-b16",
    block_size: 16,
    ..dflash::GATE_LLAMA
};
/// Drafts a round measured (blocks of one more).
const DRAFTS: [usize; 3] = [3, 7, 15];
const FIT_SCRIPT: &str = "xtask/python/fit_dflash.py";

pub fn run(args: &[String]) -> Result<()> {
    let o = fitted::parse(args, 2000)?;
    let python = venv::ensure()?;
    let target = synth_dspark::ensure(&python)?.llama.local_target;
    let random = synth_dflash::ensure(&DRAFTER)?;
    let fit = synth::derived(
        &python,
        FIT_SCRIPT,
        &format!("{}-fit", DRAFTER.name),
        &random,
        &[&target],
        &[
            "--target".into(),
            target.display().to_string(),
            "--steps".into(),
            o.steps.to_string(),
        ],
    )?;
    let work = shell::root().join("target").join("bench-dflash");
    let prompts = suite::id_prompts(DRAFTER.vocab as u64, o.prompts);
    println!(
        "\ndflash on the near-bigram synthetic llama target (hidden 64, vocab 320; drafter: 2 layers, blocks of {}), {} prompts x {} tokens, greedy",
        DRAFTER.block_size, o.prompts, o.max_tokens,
    );
    println!(
        "{:<20} {:>6} {:>8} {:>11} {:>13} {:>14} {:>10} {:>12} {:>14}",
        "drafter",
        "drafts",
        "drafted",
        "acceptance",
        "mean accepted",
        "tok / forward",
        "vs plain",
        "block ms",
        "plain step ms"
    );
    let trained = format!("trained {} steps", o.steps);
    for (label, drafter) in [("random", &random), (trained.as_str(), &fit)] {
        for drafts in DRAFTS {
            let dir = work.join(format!("{}-{drafts}", label.replace(' ', "-")));
            let t = trace(&target, drafter, &prompts, drafts, o.max_tokens, &dir)?;
            let m = Measured::of(&t);
            println!(
                "{label:<20} {drafts:>6} {:>8} {:>10.1}% {:>13.2} {:>14.2} {:>9.2}x {:>12.2} {:>14.2}{}",
                m.drafted,
                100.0 * m.acceptance,
                m.accepted_per_round,
                m.tokens_per_forward,
                m.vs_plain,
                1e3 * m.draft_seconds,
                1e3 * m.plain_step_seconds,
                m.differs()
            );
        }
    }
    Ok(())
}

/// `dflash_trace` over `prompts`, `drafts` drafts a round.
fn trace(
    target: &Path,
    drafter: &Path,
    prompts: &[Vec<u32>],
    drafts: usize,
    max_tokens: usize,
    dir: &Path,
) -> Result<DsparkTrace> {
    shell::build()?;
    let request = DflashRequest {
        target: target.to_owned(),
        drafter: drafter.to_owned(),
        prompts: prompts.to_vec(),
        num_draft: drafts,
        max_tokens,
        taps: dir.join("taps.safetensors"),
    };
    runs::example(&request, &dir.join("trace"), &[])
}
