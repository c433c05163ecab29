//! `cargo xtask bench shared-prefill`: requests sent together that share a
//! long prompt prefix, through `mlx-spec serve` on the real model
//! (SmolLM2-135M-Instruct, float32), with shared prefill (the default) and
//! with `--no-shared-prefill`, one server each, both `--max-batch` the
//! client count. Two workloads: one chat request with `n` choices of a
//! long note, and that many clients sending one long system prompt with a
//! question each. Every pass sends prompts neither server has seen, the
//! same ones to both (so their answers must agree, and do, or the bench
//! fails), in the order A B B A per round. Prints each pass's wall time
//! (all answers in), mean and last time to first token and the prompt
//! tokens the prefix cache served, and the ratios.
//!
//! Options: `--words N` (words in the shared prefix, default 400),
//! `--clients N` (default 4), `--max-tokens N` (default 16), `--rounds N`
//! (default 2).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::chat::{draw_words, generator};
use super::serve_http::{self, Server};
use crate::{real_model, shell};

struct Args {
    words: usize,
    clients: usize,
    max_tokens: usize,
    rounds: usize,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        words: 400,
        clients: 4,
        max_tokens: 16,
        rounds: 2,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--words" => a.words = value()?.parse().context("--words")?,
            "--clients" => a.clients = value()?.parse().context("--clients")?,
            "--max-tokens" => a.max_tokens = value()?.parse().context("--max-tokens")?,
            "--rounds" => a.rounds = value()?.parse().context("--rounds")?,
            other => {
                bail!("unknown option {other} (known: --words, --clients, --max-tokens, --rounds)")
            }
        }
    }
    if a.words == 0 || a.clients < 2 || a.max_tokens == 0 || a.rounds == 0 {
        bail!("--words, --max-tokens and --rounds must be at least 1, --clients at least 2");
    }
    Ok(a)
}

/// One pass of a workload on one server.
#[derive(Debug, Clone, Default)]
struct Pass {
    /// Seconds from the first request sent to the last answer in.
    wall: f64,
    /// Each answer's seconds to its first streamed text.
    first: Vec<f64>,
    /// The answers, in order.
    texts: Vec<String>,
    /// Prompt tokens the server's prefix cache served in the pass.
    cached: f64,
}

/// A chat request's body: `messages`, greedy, streamed with usage.
fn body(messages: Value, max_tokens: usize, n: usize) -> Value {
    json!({
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "n": n,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// Streams one request; each choice's text and seconds to its first text.
fn stream(agent: &ureq::Agent, base: &str, body: &Value) -> Result<Vec<(String, f64)>> {
    let streamed = serve_http::stream_chat(agent, base, body)?;
    Ok(streamed
        .choices
        .into_iter()
        .map(|(text, first)| (text, first.unwrap_or(streamed.total)))
        .collect())
}

/// The prefix cache's served prompt tokens so far.
fn cached_tokens(agent: &ureq::Agent, base: &str) -> Result<f64> {
    serve_http::metrics_text(agent, base)?
        .lines()
        .find_map(|l| {
            l.strip_prefix("mlx_spec_prefix_cache_tokens_total ")?
                .parse()
                .ok()
        })
        .context("no mlx_spec_prefix_cache_tokens_total in /metrics")
}

/// Sends `bodies` at once (one client each) and times them.
fn pass(agent: &ureq::Agent, server: &Server, bodies: &[Value]) -> Result<Pass> {
    let before = cached_tokens(agent, &server.base)?;
    let start = Instant::now();
    let answers = std::thread::scope(|s| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| s.spawn(move || stream(agent, &server.base, b)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow!("a client panicked"))
                    .and_then(|r| r)
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let wall = start.elapsed().as_secs_f64();
    let (texts, first): (Vec<String>, Vec<f64>) = answers.into_iter().flatten().unzip();
    Ok(Pass {
        wall,
        first,
        texts,
        cached: cached_tokens(agent, &server.base)? - before,
    })
}

/// The requests of pass `k` of a workload: a fresh prefix of `words` words.
fn bodies(workload: &str, k: u64, a: &Args) -> Vec<Value> {
    let mut x = generator(1000 + k);
    let prefix = draw_words(&mut x, a.words).join(" ");
    match workload {
        "n-choices" => {
            let note = format!("Note {k}: {prefix}. Which objects does note {k} mention most?");
            vec![body(
                json!([{"role": "user", "content": note}]),
                a.max_tokens,
                a.clients,
            )]
        }
        _ => (0..a.clients)
            .map(|i| {
                let system = format!("You keep inventory {k}. Its records: {prefix}.");
                let question = format!(
                    "How often does the record mention {}?",
                    draw_words(&mut x, 1).join("")
                );
                let messages = json!([
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("Question {i}: {question}")},
                ]);
                body(messages, a.max_tokens, 1)
            })
            .collect(),
    }
}

/// A configuration's passes: wall seconds, mean and last time to first
/// token.
type Totals = (Vec<f64>, Vec<f64>, Vec<f64>);

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn last(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let model = real_model::ensure()?;
    shell::run(shell::cargo().args(["build", "--release", "-q", "-p", "mlx-spec"]))?;
    let work = shell::root().join("target").join("bench-shared-prefill");
    std::fs::create_dir_all(&work)?;
    let batch = a.clients;
    eprintln!("starting two servers (batch {batch})");
    let shared = serve_http::ours(&model, batch, &work.join("shared.log"), &[])?;
    let alone = serve_http::ours(
        &model,
        batch,
        &work.join("alone.log"),
        &["--no-shared-prefill"],
    )?;
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(600))
        .build();
    for server in [&shared, &alone] {
        stream(
            &agent,
            &server.base,
            &body(json!([{"role": "user", "content": "Hi"}]), 4, 1),
        )?;
    }
    println!(
        "bench shared-prefill: {} words of shared prefix, {} clients, {} tokens each; CPU: {}",
        a.words,
        a.clients,
        a.max_tokens,
        super::cpu_model()
    );
    let mut k = 0;
    for workload in ["n-choices", "system-prompt"] {
        println!("\n{workload}:");
        println!(
            "  {:<8} {:>9} {:>11} {:>11} {:>13}",
            "config", "wall s", "mean ttft", "last ttft", "cached tokens"
        );
        let mut totals: BTreeMap<&str, Totals> = BTreeMap::new();
        for _ in 0..a.rounds {
            // A B, then B A: each pair sends the same fresh prompts.
            for order in [[&shared, &alone], [&alone, &shared]] {
                k += 1;
                let requests = bodies(workload, k, &a);
                let mut answers = Vec::new();
                for server in order {
                    let name = if std::ptr::eq(server, &shared) {
                        "shared"
                    } else {
                        "alone"
                    };
                    let p = pass(&agent, server, &requests)?;
                    println!(
                        "  {:<8} {:>9.3} {:>11.3} {:>11.3} {:>13}",
                        name,
                        p.wall,
                        mean(&p.first),
                        last(&p.first),
                        p.cached
                    );
                    let t = totals.entry(name).or_default();
                    t.0.push(p.wall);
                    t.1.push(mean(&p.first));
                    t.2.push(last(&p.first));
                    answers.push(p.texts);
                }
                if answers[0] != answers[1] {
                    bail!("{workload}: the answers differ with and without shared prefill");
                }
            }
        }
        let (s, n) = (&totals["shared"], &totals["alone"]);
        println!(
            "  without / with shared prefill: wall {:.2}x, mean ttft {:.2}x, last ttft {:.2}x (means of {} passes each)",
            mean(&n.0) / mean(&s.0),
            mean(&n.1) / mean(&s.1),
            mean(&n.2) / mean(&s.2),
            s.0.len()
        );
    }
    Ok(())
}
