//! `cargo xtask bench agent`: the agent loop through the tool-calling API.
//! `python/agent_loop.py` plays the harness with the official `openai`
//! client: per support ticket it declares the tools, forces a tool call,
//! sends the tool's result back as a `tool` message, then asks for a SQL
//! query and a fixed-format summary, the calls and results staying in the
//! history. Each provider (plain, prompt lookup, suffix) gets a fresh
//! server (release build, SmolLM2-135M float32, greedy); every ticket runs
//! on the three servers in turn, so the machine's load falls on all three
//! alike. Prints generation tokens/s (after each request's first token,
//! from the server's `timings`: what speculation speeds up, as `bench
//! agentic` measures it), tokens/s over whole requests as the harness
//! waited for them (prefill included), tokens per target forward, whether
//! every output equals plain's, and the target (suffix >= 2x plain
//! in generation tokens/s).
//!
//! Options: `--sessions N` (tickets, default 8), `--max-tokens N` (per
//! request, default 96).

use std::process::Stdio;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::serve_http;
use crate::{real_model, shell, venv};

const PROVIDERS: [&str; 3] = ["plain", "prompt-lookup", "suffix"];

struct Args {
    sessions: usize,
    max_tokens: usize,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        sessions: 8,
        max_tokens: 96,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sessions" => a.sessions = value()?.parse().context("--sessions")?,
            "--max-tokens" => a.max_tokens = value()?.parse().context("--max-tokens")?,
            other => bail!("unknown option {other} (known: --sessions, --max-tokens)"),
        }
    }
    Ok(a)
}

/// One provider's run: its requests' totals and outputs in order.
#[derive(Default)]
struct Run {
    tokens: u64,
    /// Whole requests, as the client waited.
    seconds: f64,
    /// Tokens after each request's first, and the seconds they took.
    later_tokens: u64,
    generation_seconds: f64,
    target_calls: u64,
    outputs: Vec<String>,
}

impl Run {
    /// Generation tokens/s (after each request's first token).
    fn tps(&self) -> f64 {
        self.later_tokens as f64 / self.generation_seconds.max(1e-9)
    }

    /// Tokens/s over whole requests.
    fn request_tps(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

/// Starts one server per provider, runs the harness over all of them
/// (each ticket on every server in turn), and returns each provider's run.
fn run_all(python: &std::path::Path, a: &Args) -> Result<Vec<Run>> {
    let model = real_model::ensure()?;
    let work = shell::root().join("target").join("bench-agent");
    std::fs::create_dir_all(&work)?;
    let mut servers = Vec::new();
    for provider in PROVIDERS {
        servers.push(serve_http::ours(
            &model,
            1,
            &work.join(format!("{provider}.log")),
            &[
                "--draft-provider",
                "prompt-lookup",
                "--draft-provider",
                "suffix",
            ],
        )?);
    }
    let list: Vec<String> = PROVIDERS
        .iter()
        .zip(&servers)
        .map(|(p, s)| format!("{p}={}", s.base))
        .collect();
    let out = venv::python_command(python)
        .arg(
            shell::root()
                .join("xtask")
                .join("python")
                .join("agent_loop.py"),
        )
        .args(["bench", "--servers", &list.join(","), "--api-key", "bench"])
        .args(["--sessions", &a.sessions.to_string()])
        .args(["--max-tokens", &a.max_tokens.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("running agent_loop.py")?;
    drop(servers);
    if !out.status.success() {
        bail!("agent_loop.py failed ({})", out.status);
    }
    let mut runs: Vec<Run> = PROVIDERS.iter().map(|_| Run::default()).collect();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("agent_loop.py printed `{line}`"))?;
        let field = |name: &str| {
            v[name]
                .as_u64()
                .with_context(|| format!("`{name}` in `{line}`"))
        };
        let provider = v["provider"].as_str().context("`provider`")?;
        let at = PROVIDERS
            .iter()
            .position(|p| *p == provider)
            .with_context(|| format!("unknown provider in `{line}`"))?;
        let run = &mut runs[at];
        let tokens = field("tokens")?;
        run.tokens += tokens;
        run.later_tokens += tokens.saturating_sub(1);
        run.target_calls += field("target_calls")?;
        run.seconds += v["seconds"].as_f64().context("`seconds`")?;
        run.generation_seconds += v["generation_seconds"]
            .as_f64()
            .context("`generation_seconds`")?;
        run.outputs
            .push(v["output"].as_str().context("`output`")?.to_owned());
    }
    if runs.iter().any(|r| r.outputs.is_empty()) {
        bail!("agent_loop.py reported no request for a provider");
    }
    Ok(runs)
}

pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let python = venv::ensure()?;
    shell::build()?;
    println!(
        "agent loop over Chat Completions with tools: {} tickets x 4 requests (forced tool call, \
         after the tool result, SQL, summary), {} tokens max, {}, float32, greedy; CPU: {}",
        a.sessions,
        a.max_tokens,
        real_model::NAME,
        super::cpu_model()
    );
    let runs = run_all(&python, &a)?;
    let (plain, lookup) = (runs[0].tps(), runs[1].tps());
    println!(
        "{:<14} {:>7} {:>8} {:>9} {:>10} {:>13} {:>13} {:>10}",
        "provider",
        "tokens",
        "tok/s",
        "vs plain",
        "vs lookup",
        "request tok/s",
        "tok / forward",
        "identical"
    );
    for (provider, run) in PROVIDERS.iter().zip(&runs) {
        let same = run
            .outputs
            .iter()
            .zip(&runs[0].outputs)
            .filter(|(a, b)| a == b)
            .count();
        println!(
            "{provider:<14} {:>7} {:>8.2} {:>8.2}x {:>9.2}x {:>13.2} {:>13.2} {:>5}/{:<4}",
            run.tokens,
            run.tps(),
            run.tps() / plain,
            run.tps() / lookup,
            run.request_tps(),
            run.tokens as f64 / run.target_calls.max(1) as f64,
            same,
            runs[0].outputs.len()
        );
    }
    let identical = runs
        .iter()
        .all(|r| r.outputs == runs[0].outputs && r.tokens == runs[0].tokens);
    let ratio = runs[2].tps() / plain;
    let met = if ratio >= 2.0 { "met" } else { "MISSED" };
    println!(
        "suffix vs plain, generation tokens/s: {ratio:.2}x (target >= 2x): {met}; whole requests: {:.2}x",
        runs[2].request_tps() / runs[0].request_tps()
    );
    if !identical {
        bail!("speculation changed an output: see the `identical` column");
    }
    Ok(())
}
