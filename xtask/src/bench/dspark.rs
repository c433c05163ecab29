//! `cargo xtask bench dspark`: the `deepspec` provider with the fitted
//! synthetic DSpark drafters (float32, bfloat16, 8-bit, 4-bit) on the
//! near-bigram copies of the synthetic llama and gemma4_text targets they
//! were fitted to: acceptance and tokens per target
//! forward (what drafter numerics move), and wall time against plain greedy
//! decoding of the same prompts in the same process.
//!
//! Options: `--prompts N` (default 24), `--max-tokens N` (default 64).

use anyhow::{bail, Context, Result};

use run_protocol::dspark::{DsparkRun, DsparkTrace};

use crate::gate::dspark::trace;
use crate::gate::suite;
use crate::{shell, synth_dspark, venv};

fn parse(args: &[String]) -> Result<(usize, usize)> {
    let (mut prompts, mut max_tokens) = (24, 64);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--prompts" => prompts = value()?.parse().context("--prompts")?,
            "--max-tokens" => max_tokens = value()?.parse().context("--max-tokens")?,
            other => bail!("unknown option {other} (known: --prompts, --max-tokens)"),
        }
    }
    Ok((prompts, max_tokens))
}

pub fn run(args: &[String]) -> Result<()> {
    let (count, max_tokens) = parse(args)?;
    let python = venv::ensure()?;
    let d = synth_dspark::ensure(&python)?;
    let work = shell::root().join("target").join("bench-dspark");
    let prompts = suite::id_prompts(320, count);
    for (name, pair) in [("llama", &d.llama), ("gemma4_text", &d.gemma4)] {
        println!(
            "\ndeepspec on the near-bigram synthetic {name} target (hidden 64, vocab 320), {count} prompts x {max_tokens} tokens, greedy, {} drafts a round",
            synth_dspark::BLOCK_SIZE
        );
        println!(
            "{:<24} {:>9} {:>8} {:>11} {:>13} {:>14} {:>10}",
            "drafter",
            "threshold",
            "drafted",
            "acceptance",
            "mean accepted",
            "tok / forward",
            "vs plain"
        );
        for (label, drafter, threshold, keep) in [
            ("fit f32", &pair.fit, 0.0, false),
            ("fit bf16", &pair.fit_bf16, 0.0, false),
            ("fit 8-bit g32", &pair.fit_q8, 0.0, false),
            ("fit 4-bit g64", &pair.fit_q4, 0.0, false),
            ("fit 4-bit g64 (kept)", &pair.fit_q4, 0.0, true),
            ("fit bf16", &pair.fit_bf16, 0.5, false),
            ("fit 4-bit g64", &pair.fit_q4, 0.5, false),
        ] {
            let dir = work.join(format!(
                "{name}-{}-{threshold}",
                label.replace([' ', '(', ')'], "_")
            ));
            let t = trace(
                &pair.local_target,
                drafter,
                threshold,
                keep,
                &prompts,
                &dir,
                max_tokens,
            )?;
            report(label, threshold, &t);
        }
    }
    Ok(())
}

fn report(label: &str, threshold: f32, t: &DsparkTrace) {
    let m = Measured::of(t);
    println!(
        "{label:<24} {threshold:>9} {:>8} {:>10.1}% {:>13.2} {:>14.2} {:>9.2}x{}",
        m.drafted,
        100.0 * m.acceptance,
        m.accepted_per_round,
        m.tokens_per_forward,
        m.vs_plain,
        m.differs()
    );
}

/// What a traced run measured, over all its requests.
pub(super) struct Measured {
    pub drafted: usize,
    /// Accepted drafts over drafted ones.
    pub acceptance: f64,
    /// Accepted drafts per round that drafted.
    pub accepted_per_round: f64,
    /// Emitted tokens per target forward.
    pub tokens_per_forward: f64,
    /// Plain decoding's seconds over speculative decoding's.
    pub vs_plain: f64,
    /// The drafter's mean seconds per round that drafted.
    pub draft_seconds: f64,
    /// Plain decoding's seconds per emitted token (about one target step).
    pub plain_step_seconds: f64,
    /// Whether every request's speculative tokens equal its plain ones.
    pub identical: bool,
}

impl Measured {
    pub fn of(t: &DsparkTrace) -> Self {
        let sum = |f: fn(&DsparkRun) -> usize| t.requests.iter().map(f).sum::<usize>();
        let (drafted, accepted, calls, tokens) = (
            sum(|r| r.drafted),
            sum(|r| r.accepted),
            sum(|r| r.target_calls),
            sum(|r| r.tokens.len()),
        );
        let drafting = || {
            t.requests
                .iter()
                .flat_map(|r| r.rounds.iter().filter(|x| !x.drafts.is_empty()))
        };
        let rounds = drafting().count();
        let (spec_s, plain_s): (f64, f64) = t.requests.iter().fold((0.0, 0.0), |(a, b), r| {
            (a + r.generation_seconds, b + r.plain_seconds)
        });
        let plain_tokens = sum(|r| r.plain_tokens.len());
        Measured {
            drafted,
            acceptance: accepted as f64 / drafted.max(1) as f64,
            accepted_per_round: accepted as f64 / rounds.max(1) as f64,
            tokens_per_forward: tokens as f64 / calls.max(1) as f64,
            vs_plain: plain_s / spec_s.max(1e-9),
            draft_seconds: drafting().map(|x| x.draft_seconds).sum::<f64>() / rounds.max(1) as f64,
            plain_step_seconds: plain_s / plain_tokens.max(1) as f64,
            identical: t.requests.iter().all(|r| r.tokens == r.plain_tokens),
        }
    }

    /// A warning to print after the row where the outputs differ.
    pub fn differs(&self) -> &'static str {
        if self.identical {
            ""
        } else {
            "  (OUTPUT DIFFERS FROM PLAIN)"
        }
    }
}
