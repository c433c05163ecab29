//! The batched part of `cargo xtask gate distributed`: each model served by
//! `mlx-spec serve --pipeline` over 2 local ranks (`launch --np 2`) answers
//! concurrent requests, one per provider, as a single-process `serve`
//! answers each alone, token for token, and the requests share pipeline
//! passes (the server's `mlx_spec_rows_per_step`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use run_protocol::spec::PLAIN;
use serde_json::{json, Value};

use super::distributed::{Case, ENV, MAX_TOKENS};
use crate::shell;

/// Ranks of the pipelined server.
const RANKS: usize = 2;
/// Longest wait for a server to print its address or to end.
const WAIT: Duration = Duration::from_secs(300);

/// What one case gave: whether every request matched, and the row for the
/// gate's table.
pub struct Outcome {
    pub same: bool,
    pub line: String,
}

/// A running server (single or launched), stopped however the gate ends.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[String]) -> Result<Server> {
        let exe = shell::out_dir().join("mlx-spec");
        let mut child = Command::new(&exe)
            .args(args)
            .envs(ENV.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut first = String::new();
            let _ = BufReader::new(stdout).read_line(&mut first);
            let _ = tx.send(first);
        });
        let mut server = Server {
            child,
            addr: String::new(),
        };
        let first = rx
            .recv_timeout(WAIT)
            .with_context(|| format!("the server printed no address within {WAIT:?}"))?;
        server.addr = first
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http://"))
            .with_context(|| format!("no address in `{first}`"))?
            .to_owned();
        Ok(server)
    }

    /// Stops the server with SIGTERM (`launch` passes it to rank 0, which
    /// tells the other ranks) and waits for its end.
    fn stop(mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status()?;
        if !sent.success() {
            bail!("kill -TERM {pid} failed");
        }
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("the server ended with {status} when stopped");
                }
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the server still ran 60 s after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends one HTTP/1.1 request and returns the status and body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(WAIT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line in `{response}`"))?;
    let (_, body) = response.split_once("\r\n\r\n").unwrap_or_default();
    Ok((status, body.to_owned()))
}

/// The completion's text and token count.
fn complete(addr: &str, path: &str, ask: &Value) -> Result<(String, u64)> {
    let (status, body) = http(addr, "POST", path, &ask.to_string())?;
    let json: Value = serde_json::from_str(&body).with_context(|| format!("body `{body}`"))?;
    if status != 200 {
        bail!("status {status}: {json}");
    }
    let choice = &json["choices"][0];
    let text = choice["message"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .context("no text in the answer")?;
    let tokens = json["usage"]["completion_tokens"]
        .as_u64()
        .context("no completion_tokens")?;
    Ok((text.to_owned(), tokens))
}

/// A metric's value from `/metrics`.
fn metric(addr: &str, name: &str) -> Result<f64> {
    let (_, text) = http(addr, "GET", "/metrics", "")?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("{name} missing from /metrics"))
}

/// The endpoint and request of `case` with provider `id` (`plain`: none).
fn request(case: &Case, id: &str) -> Result<(&'static str, Value)> {
    let text = case
        .prompt
        .iter()
        .skip_while(|a| *a != "--prompt")
        .nth(1)
        .context("the case has no --prompt")?;
    let speculative = if id == PLAIN {
        json!(false)
    } else {
        json!({"provider": id})
    };
    let mut ask = json!({"max_tokens": MAX_TOKENS, "temperature": 0, "speculative": speculative});
    if case.prompt.iter().any(|a| a == "--no-chat-template") {
        ask["prompt"] = json!(text);
        Ok(("/v1/completions", ask))
    } else {
        ask["messages"] = json!([{"role": "user", "content": text}]);
        Ok(("/v1/chat/completions", ask))
    }
}

/// The server arguments for `case`: every provider loaded, `generate`'s
/// `--draft-model` given as the provider's `model` option.
fn serve_args(case: &Case) -> Result<Vec<String>> {
    let mut args = vec![
        "serve".to_owned(),
        "--port".into(),
        "0".into(),
        "--model".into(),
        case.model.to_string_lossy().into_owned(),
        "--max-batch".into(),
        case.providers.len().to_string(),
    ];
    args.extend(case.load.iter().cloned());
    for (id, extra) in &case.providers {
        if *id == PLAIN {
            continue;
        }
        args.extend(["--draft-provider".to_owned(), (*id).to_owned()]);
        for pair in extra.chunks(2) {
            match pair {
                [flag, value] if flag == "--draft-model" => {
                    args.extend(["--draft-option".to_owned(), format!("{id}:model={value}")]);
                }
                other => bail!("no server option for {id}'s {other:?}"),
            }
        }
    }
    Ok(args)
}

/// Runs `case`: each request alone on a single process, then all together
/// on a pipeline of [`RANKS`].
pub fn run(case: &Case) -> Result<Outcome> {
    let asks = case
        .providers
        .iter()
        .map(|(id, _)| request(case, id))
        .collect::<Result<Vec<_>>>()?;
    let args = serve_args(case)?;
    let single = Server::start(&args)?;
    let alone = asks
        .iter()
        .map(|(path, ask)| complete(&single.addr, path, ask))
        .collect::<Result<Vec<_>>>()?;
    drop(single);

    let mut launched = vec![
        "launch".to_owned(),
        "--np".into(),
        RANKS.to_string(),
        "--".into(),
    ];
    launched.extend(args);
    launched.push("--pipeline".into());
    let t = Instant::now();
    let server = Server::start(&launched)?;
    let together: Vec<Result<(String, u64)>> = std::thread::scope(|scope| {
        let clients: Vec<_> = asks
            .iter()
            .map(|(path, ask)| {
                let addr = &server.addr;
                scope.spawn(move || complete(addr, path, ask))
            })
            .collect();
        clients
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let steps = metric(&server.addr, "mlx_spec_rows_per_step_count")?;
    let single_row = metric(&server.addr, "mlx_spec_rows_per_step_bucket{le=\"1\"}")?;
    let rows = metric(&server.addr, "mlx_spec_rows_per_step_sum")?;
    server.stop()?;
    let seconds = t.elapsed().as_secs_f64();
    let mut identical = 0;
    for (((id, _), want), got) in case.providers.iter().zip(&alone).zip(&together) {
        match got {
            Ok(got) if got == want => identical += 1,
            Ok(got) => eprintln!(
                "distributed: {} {id} batched over {RANKS} ranks differs:\n--- alone\n{want:?}\n--- batched\n{got:?}",
                case.label
            ),
            Err(e) => eprintln!("distributed: {} {id} batched: {e:#}", case.label),
        }
    }
    let shared = steps - single_row;
    let same = identical == asks.len() && shared >= 1.0;
    if shared < 1.0 {
        eprintln!(
            "distributed: {} batched: no pass carried two requests ({steps} steps)",
            case.label
        );
    }
    let line = format!(
        "{:<18} {:<18} {:>5} {:>9} {:>14} {:>28}   {seconds:.1}s",
        case.label,
        format!("batch of {}", asks.len()),
        RANKS,
        if same { "yes" } else { "NO" },
        format!("{:.2} rows/pass", rows / steps.max(1.0)),
        format!("{shared} of {steps} passes shared"),
    );
    Ok(Outcome { same, line })
}
