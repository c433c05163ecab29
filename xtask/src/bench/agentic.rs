//! `cargo xtask bench agentic`: suffix decoding's workload. An agent loop's
//! requests (`agentic_workload.rs`: tool calls, SQL, code edits, structured
//! summaries; fixed seed) run in order on one instance of each provider, so
//! `suffix`'s global tree fills as the loop goes; plain decoding, prompt
//! lookup and suffix decoding in one run on the real model (SmolLM2-135M,
//! float32), then the suite's open-ended prompts. Prints tokens/s ratios,
//! tokens per target forward and acceptance, and each target of issue 17
//! with whether this run met it.
//!
//! Options: `--max-tokens N` (default 128), `--sessions N` (four requests
//! each, default 10), `--seed S` (default 17).

use anyhow::{bail, Context, Result};

use super::agentic_workload;
use super::spec::{summarize, tps, Summary};
use run_protocol::providers::{PROMPT_LOOKUP, SUFFIX};
use run_protocol::spec::{SpecRequest, PLAIN};
use run_protocol::Dtype;

use crate::gate::suite;
use crate::{real_model, shell, venv};

const PROVIDERS: [&str; 3] = [PLAIN, PROMPT_LOOKUP, SUFFIX];

struct Args {
    max_tokens: usize,
    sessions: usize,
    seed: u64,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        max_tokens: 128,
        sessions: 10,
        seed: 17,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--max-tokens" => a.max_tokens = value()?.parse().context("--max-tokens")?,
            "--sessions" => a.sessions = value()?.parse().context("--sessions")?,
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            other => bail!("unknown option {other} (known: --max-tokens, --sessions, --seed)"),
        }
    }
    Ok(a)
}

/// One row per provider; returns each provider's summary.
fn table(set: &str, texts: &[String], max_tokens: usize) -> Result<Vec<(String, Summary)>> {
    let model = real_model::ensure()?;
    let ids: Vec<String> = PROVIDERS.iter().map(|p| p.to_string()).collect();
    let request = SpecRequest::new(
        model,
        Dtype::F32,
        suite::chat_prompts(texts),
        max_tokens,
        ids.clone(),
    );
    let work = shell::root().join("target").join("bench-agentic");
    let results = suite::spec_run(&request, &work, set, &[])?;
    let mut out = Vec::new();
    for id in &ids {
        let runs = results.alone(id);
        if runs.is_empty() {
            bail!("no runs for {id}");
        }
        out.push((id.clone(), summarize(runs)));
    }
    let plain = tps(&out[0].1);
    let lookup = tps(&out[1].1);
    for (id, s) in &out {
        let acceptance = if s.drafted == 0 {
            0.0
        } else {
            100.0 * s.accepted as f64 / s.drafted as f64
        };
        println!(
            "{set:<11} {id:<14} {:>7} {:>8.2} {:>8.2}x {:>8.2}x {:>10.1}% {:>13.2}",
            s.tokens,
            tps(s),
            tps(s) / plain,
            tps(s) / lookup,
            acceptance,
            s.tokens as f64 / s.target_calls.max(1) as f64
        );
    }
    Ok(out)
}

fn verdict(what: &str, value: f64, target: f64) {
    let met = if value >= target { "met" } else { "MISSED" };
    println!("{what}: {value:.2}x (target >= {target}x): {met}");
}

pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    venv::ensure()?;
    suite::build_runner()?;
    let workload = agentic_workload::requests(a.seed, a.sessions);
    let open_ended = suite::suite()?.open_ended;
    println!(
        "agentic workload: {} requests (seed {}), in order on one instance per provider; {} open-ended prompts; {} on {}, float32, {} tokens max",
        workload.len(),
        a.seed,
        open_ended.len(),
        PROVIDERS.join(" / "),
        real_model::NAME,
        a.max_tokens
    );
    println!(
        "{:<11} {:<14} {:>7} {:>8} {:>9} {:>9} {:>11} {:>13}",
        "set",
        "provider",
        "tokens",
        "tok/s",
        "vs plain",
        "vs lookup",
        "acceptance",
        "tok / forward"
    );
    let agentic = table("agentic", &workload, a.max_tokens)?;
    let open = table("open-ended", &open_ended, a.max_tokens)?;
    let (plain, lookup, suffix) = (tps(&agentic[0].1), tps(&agentic[1].1), tps(&agentic[2].1));
    println!();
    verdict("agentic, suffix vs plain", suffix / plain, 2.0);
    verdict("agentic, suffix vs prompt lookup", suffix / lookup, 1.3);
    verdict(
        "open-ended, suffix vs plain",
        tps(&open[2].1) / tps(&open[0].1),
        0.95,
    );
    Ok(())
}
