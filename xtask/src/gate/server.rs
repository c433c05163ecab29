//! `cargo xtask gate server`: a live `mlx-spec serve` on 127.0.0.1 driven by
//! the official `openai` client (`python/server_check.py`): streaming and not,
//! chat template, per-request provider switch, `suffix` drafting from an
//! earlier request (lossless), stop sequences, max_tokens, log-probabilities
//! (consistent, unchanged by speculation, streamed), `logit_bias`,
//! `response_format` (JSON schema, regex, Lark grammar), bad values as 400s
//! beside a good request,
//! errors mapped to the client's exception types, client disconnects, a
//! bounded load test with 429 past the queue, MLX memory back at its idle
//! level, and a schemathesis run against the server's own OpenAPI document
//! that must find no 5xx; Anthropic's Messages API with the official
//! `anthropic` client (`python/anthropic_check.py`: text streamed and not,
//! a forced tool_use and its tool_result turn, `output_config`,
//! `count_tokens`, speculation equal to none, errors, `x-api-key`). Then, on
//! the real model's float32 files: the agent
//! loop (`python/agent_loop.py check`: a forced tool call, its result sent
//! back, more turns, over Chat Completions with `openai` and Messages with
//! `anthropic`; prompt lookup, suffix and a draft model, the 4-bit copy
//! of the target, equal to plain), and the
//! log-probabilities of three greedy chats against `mlx_lm.server`'s on the
//! same files (`python/logprobs_oracle.py`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use run_protocol::providers::{DRAFT_MODEL, PROMPT_LOOKUP, SUFFIX};

use super::{suite, Counts};
use crate::bench::serve_http;
use crate::{real_model, shell, venv};

const CAPACITY: usize = 3;
const API_KEY: &str = "gate-key";

/// Kills the server however the gate ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run() -> Result<Counts> {
    let python = venv::ensure()?;
    shell::build()?;
    let mut child = shell::bin("mlx-spec")
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--max-concurrency",
            &CAPACITY.to_string(),
            "--api-key",
            API_KEY,
            "--draft-provider",
            PROMPT_LOOKUP,
            "--draft-provider",
            SUFFIX,
            // Requests without `max_tokens` (schemathesis sends many) decode
            // as many tokens as the OpenAPI document allows, not 256; every
            // check of server_check.py names its own.
            "--default-max-tokens",
            "8",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting mlx-spec serve")?;
    let stdout = child.stdout.take().context("server stdout")?;
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(300))
        .context("the server printed no address within 5 minutes")?;
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .with_context(|| format!("no address in `{first}`"))?
        .to_owned();
    eprintln!("gate server: {base}");
    let schemathesis = python.with_file_name("schemathesis");
    let openai = script(
        &python,
        "server_check.py",
        &[
            "--base",
            &base,
            "--api-key",
            API_KEY,
            "--capacity",
            &CAPACITY.to_string(),
            "--schemathesis",
            &schemathesis.to_string_lossy(),
        ],
        "server: ",
    )?;
    let messages = script(
        &python,
        "anthropic_check.py",
        &["--base", &base, "--api-key", API_KEY],
        "anthropic: ",
    )?;
    drop(server);
    // The real model's float32 files: our server and mlx_lm.server read the
    // same ones.
    let model = real_model::ensure()?;
    let work = shell::root().join("target").join("gate-server");
    std::fs::create_dir_all(&work)?;
    let drafter = suite::real_drafter(&python)?;
    let drafter_option = format!("{DRAFT_MODEL}:model={}", drafter.display());
    let ours = serve_http::ours(
        &model,
        CAPACITY,
        &work.join("mlx-spec.log"),
        &[
            "--draft-provider",
            PROMPT_LOOKUP,
            "--draft-provider",
            SUFFIX,
            "--draft-provider",
            DRAFT_MODEL,
            "--draft-option",
            &drafter_option,
        ],
    )?;
    let providers = [PROMPT_LOOKUP, SUFFIX, DRAFT_MODEL].join(",");
    let agent = script(
        &python,
        "agent_loop.py",
        &[
            "check",
            "--base",
            &ours.base,
            "--api-key",
            API_KEY,
            "--providers",
            &providers,
        ],
        "agent: ",
    )?;
    let theirs = serve_http::mlx_lm(&python, &model, 1, &work.join("mlx_lm.log"))?;
    let logprobs = script(
        &python,
        "logprobs_oracle.py",
        &[
            "--ours",
            &ours.base,
            "--theirs",
            &theirs.base,
            "--model",
            &model.to_string_lossy(),
        ],
        "logprobs: ",
    )?;
    Ok(Counts {
        passed: openai.passed + messages.passed + agent.passed + logprobs.passed,
        failed: openai.failed + messages.failed + agent.failed + logprobs.failed,
    })
}

/// Runs `python/<name>` with `args`; its last line starting with `summary`
/// holds `N passed, M failed`.
fn script(python: &std::path::Path, name: &str, args: &[&str], summary: &str) -> Result<Counts> {
    let out = venv::python_command(python)
        .arg(shell::root().join("xtask").join("python").join(name))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {name}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("{text}");
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with(summary))
        .with_context(|| format!("{name} printed no summary"))?;
    let nums: Vec<u64> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match nums.as_slice() {
        [passed, failed] => Ok(Counts {
            passed: *passed,
            failed: *failed,
        }),
        _ => bail!("cannot read `{last}`"),
    }
}
