//! What `bench serve` talks to: a server process on loopback (mlx-lm's
//! `mlx_lm.server` or our `mlx-spec serve`), killed however the bench ends,
//! and one streamed chat completion timed as a client sees it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{shell, venv};

/// A running server; dropping it kills the process.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a server may take to load before the bench gives up.
const READY_WITHIN: Duration = Duration::from_secs(300);

/// `mlx_lm.server` from the project venv on the same kernels as ours (our
/// GEMM front and Debian's OpenBLAS preloaded), batching up to `batch`
/// requests, its log in `log`.
pub(crate) fn mlx_lm(python: &Path, model: &Path, batch: usize, log: &Path) -> Result<Server> {
    let port = free_port()?;
    let mut cmd = venv::python_command(python);
    cmd.args(["-m", "mlx_lm.server", "--model"])
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--decode-concurrency", &batch.to_string()])
        .args(["--prompt-concurrency", &batch.to_string()]);
    let child = spawn(cmd, log, false)?;
    let server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    wait_ready(&server)?;
    Ok(server)
}

/// Our `mlx-spec serve` (release build), batching up to `batch` requests,
/// prompt lookup loaded for the requests that name it, `extra` appended to
/// its arguments.
pub(crate) fn ours(model: &Path, batch: usize, log: &Path, extra: &[&str]) -> Result<Server> {
    let mut cmd = shell::bin("mlx-spec");
    cmd.args(["serve", "--model"])
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(["--max-batch", &batch.to_string()])
        .args(extra);
    let mut child = spawn(cmd, log, true)?;
    let stdout = child.stdout.take().context("the server's stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Keeps reading so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut server = Server {
        child,
        base: String::new(),
    };
    let first = rx
        .recv_timeout(READY_WITHIN)
        .context("mlx-spec serve printed no address")?;
    server.base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .with_context(|| format!("no address in `{first}`"))?
        .trim_end_matches('/')
        .to_owned();
    wait_ready(&server)?;
    Ok(server)
}

/// Starts `cmd` with its stderr in `log`; its stdout too, unless `piped`.
fn spawn(mut cmd: Command, log: &Path, piped: bool) -> Result<Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let stdout = if piped {
        Stdio::piped()
    } else {
        Stdio::from(file.try_clone()?)
    };
    cmd.stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))
}

/// A port nothing listens on now (the server binds it right after).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `GET /v1/models` until it answers (both servers serve it).
fn wait_ready(server: &Server) -> Result<()> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    let start = Instant::now();
    while start.elapsed() < READY_WITHIN {
        if agent
            .get(&format!("{}/v1/models", server.base))
            .call()
            .is_ok()
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("{} did not answer within {READY_WITHIN:?}", server.base)
}

/// The server's `/metrics` text.
pub(crate) fn metrics_text(agent: &ureq::Agent, base: &str) -> Result<String> {
    Ok(agent
        .get(&format!("{base}/metrics"))
        .call()
        .context("GET /metrics")?
        .into_string()?)
}

/// One request as the client saw it.
#[derive(Debug, Clone)]
pub(crate) struct Timed {
    /// Completion tokens (the usage field).
    pub tokens: usize,
    /// The streamed text.
    pub text: String,
    /// Seconds from sending to the first streamed text.
    pub first_token: f64,
    /// Seconds from sending to the end of the stream.
    pub total: f64,
    /// When it was sent and when its stream ended.
    pub sent: Instant,
    pub ended: Instant,
}

/// Streams one greedy chat completion of `prompt` (with `speculative` as
/// the request's speculation field, when given).
pub(crate) fn complete(
    agent: &ureq::Agent,
    base: &str,
    prompt: &str,
    max_tokens: usize,
    speculative: Option<&Value>,
) -> Result<Timed> {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(s) = speculative {
        body["speculative"] = s.clone();
    }
    let streamed = stream_chat(agent, base, &body)?;
    let tokens = streamed
        .tokens
        .with_context(|| format!("{base}: no usage in the stream"))?;
    let (text, first) = streamed.choices.into_iter().next().unwrap_or_default();
    Ok(Timed {
        tokens,
        first_token: first.unwrap_or(streamed.total),
        total: streamed.total,
        text,
        sent: streamed.sent,
        ended: streamed.ended,
    })
}

/// A streamed chat completion as the client saw it.
pub(crate) struct Streamed {
    /// Each choice's text and seconds to its first text, by index.
    pub choices: Vec<(String, Option<f64>)>,
    /// The usage's completion tokens.
    pub tokens: Option<usize>,
    /// Seconds from sending to the end of the stream.
    pub total: f64,
    pub sent: Instant,
    pub ended: Instant,
}

/// POSTs `body` (a streamed chat completion) and reads its stream.
pub(crate) fn stream_chat(agent: &ureq::Agent, base: &str, body: &Value) -> Result<Streamed> {
    let sent = Instant::now();
    let response = agent
        .post(&format!("{base}/v1/chat/completions"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
        .with_context(|| format!("POST {base}/v1/chat/completions"))?;
    let mut choices: BTreeMap<u64, (String, Option<f64>)> = BTreeMap::new();
    let mut tokens = None;
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value =
            serde_json::from_str(data).with_context(|| format!("a stream chunk: {data}"))?;
        if let Some(error) = chunk.get("error") {
            bail!("{base}: the stream failed: {error}");
        }
        for c in chunk["choices"].as_array().into_iter().flatten() {
            let piece = c["delta"]["content"].as_str().unwrap_or_default();
            let (text, first) = choices.entry(c["index"].as_u64().unwrap_or(0)).or_default();
            if !piece.is_empty() {
                first.get_or_insert_with(|| sent.elapsed().as_secs_f64());
                text.push_str(piece);
            }
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n as usize);
        }
    }
    let ended = Instant::now();
    Ok(Streamed {
        choices: choices.into_values().collect(),
        tokens,
        total: ended.duration_since(sent).as_secs_f64(),
        sent,
        ended,
    })
}
