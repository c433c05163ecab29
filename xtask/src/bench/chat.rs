//! `cargo xtask bench chat`: prefix reuse across a chat's turns. One
//! deterministic conversation (user turns generated here, the server's own
//! greedy answers in the history) grows to a few thousand tokens on the real
//! model (SmolLM2-135M-Instruct, float32), streamed through each server's
//! chat endpoint by the `openai` client (`python/bench_chat_client.py`):
//! `mlx_lm.server` 0.32.2 (its LRU prompt cache on, on our GEMM front and
//! OpenBLAS), ours, ours with the prefix cache off, and ours restarted on a
//! `--prompt-cache-dir` the previous run filled. Prints the time to first
//! token of each turn side by side with ratios, each configuration's total,
//! and the targets of issue 16 with whether this run met them.
//!
//! Options: `--turns N` (default 10), `--words N` (words per user turn,
//! default 200), `--max-tokens N` (default 48), `--seed S` (default 16).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::cpu_model;
use crate::{real_model, shell, venv};

struct Args {
    turns: usize,
    words: usize,
    max_tokens: usize,
    seed: u64,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        turns: 10,
        words: 200,
        max_tokens: 48,
        seed: 16,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--turns" => a.turns = value()?.parse().context("--turns")?,
            "--words" => a.words = value()?.parse().context("--words")?,
            "--max-tokens" => a.max_tokens = value()?.parse().context("--max-tokens")?,
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            other => {
                bail!("unknown option {other} (known: --turns, --words, --max-tokens, --seed)")
            }
        }
    }
    if a.turns == 0 {
        bail!("--turns must be at least 1");
    }
    Ok(a)
}

const WORDS: &[&str] = &[
    "river", "garden", "engine", "market", "winter", "signal", "harbor", "lantern", "orchard",
    "bridge", "meadow", "copper", "valley", "forest", "canal", "letter", "window", "ladder",
    "castle", "mirror", "pepper", "saddle", "tunnel", "violin", "anchor", "basket", "candle",
    "desert", "feather", "glacier", "hammer", "island", "jacket", "kettle", "lemon", "marble",
    "needle", "oyster", "pillow", "quarry", "rocket", "silver", "ticket", "umbrella", "velvet",
    "walnut", "yellow", "zephyr", "the", "a", "of", "and", "near", "under", "beside", "with",
    "slowly", "quietly", "bright", "old", "small", "green", "north", "early",
];

/// The user turns: notes of `words` words drawn with a fixed generator,
/// each ending with a short question about them.
fn conversation(a: &Args) -> Vec<String> {
    let mut x = generator(a.seed);
    (1..=a.turns)
        .map(|k| {
            let words = draw_words(&mut x, a.words);
            format!(
                "Note {k}: {}. In one short sentence, which objects does note {k} mention most?",
                words.join(" ")
            )
        })
        .collect()
}

/// A word generator's state for `seed`.
pub(super) fn generator(seed: u64) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// `n` words drawn with the generator `x` (xorshift).
pub(super) fn draw_words(x: &mut u64, n: usize) -> Vec<&'static str> {
    (0..n)
        .map(|_| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            WORDS[(*x % WORDS.len() as u64) as usize]
        })
        .collect()
}

/// Kills the server however the bench ends.
struct Server(Child);

impl Drop for Server {
    /// SIGTERM first (our server then writes its queued prompt-cache
    /// files, which the restarted run reads), SIGKILL after 30 s.
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let termed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while termed && Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port (for servers that take no port 0).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until `GET /v1/models` answers 200 (bounded), failing early if the
/// server exits.
fn wait_ready(server: &mut Server, addr: &str, what: &str) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(600) {
        if let Some(status) = server.0.try_wait()? {
            bail!("{what} exited while starting ({status})");
        }
        let ok = TcpStream::connect(addr).ok().and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            write!(
                s,
                "GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .ok()?;
            let mut head = [0u8; 12];
            s.read_exact(&mut head).ok()?;
            Some(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
        });
        if ok == Some(true) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("{what} did not answer within 10 minutes")
}

/// `mlx-spec serve` on the model, with `extra` flags; its address.
fn ours(model: &Path, extra: &[&str]) -> Result<(Server, String)> {
    let mut child = shell::bin("mlx-spec")
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"])
        .arg(model)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting mlx-spec serve")?;
    let stdout = child.stdout.take().context("server stdout")?;
    let mut server = Server(child);
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first)?;
    let addr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .with_context(|| format!("no address in `{first}`"))?
        .to_owned();
    wait_ready(&mut server, &addr, "mlx-spec serve")?;
    Ok((server, addr))
}

/// `mlx_lm.server` on the model, on our GEMM front and OpenBLAS.
fn mlx_lm(python: &Path, model: &Path) -> Result<(Server, String)> {
    let port = free_port()?;
    let child = venv::python_command(python)
        .args(["-m", "mlx_lm.server", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--model")
        .arg(model)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting mlx_lm.server")?;
    let mut server = Server(child);
    let addr = format!("127.0.0.1:{port}");
    wait_ready(&mut server, &addr, "mlx_lm.server")?;
    Ok((server, addr))
}

#[derive(Debug, Deserialize)]
struct Turn {
    ttft: f64,
    total: f64,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    answer: String,
}

#[derive(Debug, Deserialize)]
struct Conversation {
    turns: Vec<Turn>,
}

/// Runs the conversation against the server at `addr`, naming `model`.
fn converse(
    python: &Path,
    addr: &str,
    model: &str,
    turns: &Path,
    max_tokens: usize,
) -> Result<Vec<Turn>> {
    let out = venv::python_command(python)
        .arg(
            shell::root()
                .join("xtask")
                .join("python")
                .join("bench_chat_client.py"),
        )
        .args([
            "--base",
            &format!("http://{addr}"),
            "--model",
            model,
            "--turns",
        ])
        .arg(turns)
        .args(["--max-tokens", &max_tokens.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("running bench_chat_client.py")?;
    if !out.status.success() {
        bail!("bench_chat_client.py failed ({})", out.status);
    }
    let parsed: Conversation = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading `{}`", String::from_utf8_lossy(&out.stdout)))?;
    Ok(parsed.turns)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn verdict(what: &str, met: bool) {
    println!("{what}: {}", if met { "met" } else { "MISSED" });
}

pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let python = venv::ensure()?;
    shell::run(shell::cargo().args(["build", "--release", "-q", "-p", "mlx-spec"]))?;
    let model = real_model::ensure()?;
    let work = shell::root().join("target").join("bench-chat");
    std::fs::create_dir_all(&work)?;
    let turns_file = work.join("turns.json");
    std::fs::write(&turns_file, serde_json::to_string(&conversation(&a))?)?;
    let cache_dir = work.join("prompt-cache");
    if cache_dir.exists() {
        std::fs::remove_dir_all(&cache_dir)?;
    }
    let ours_name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "chat: {} turns of {} words, {} tokens max each, greedy, streaming; {} float32; {}; load average {} at the start",
        a.turns,
        a.words,
        a.max_tokens,
        real_model::NAME,
        cpu_model(),
        load_average()
    );

    let run_ours = |extra: &[&str]| -> Result<Vec<Turn>> {
        let (server, addr) = ours(&model, extra)?;
        let turns = converse(&python, &addr, &ours_name, &turns_file, a.max_tokens)?;
        drop(server);
        Ok(turns)
    };
    let reference = {
        let (server, addr) = mlx_lm(&python, &model)?;
        // mlx-lm's name for the model its `--model` loaded.
        let turns = converse(&python, &addr, "default_model", &turns_file, a.max_tokens)?;
        drop(server);
        turns
    };
    let warm = run_ours(&[])?;
    let off = run_ours(&["--prompt-cache-bytes", "0"])?;
    let dir = cache_dir.to_string_lossy().into_owned();
    // A first run fills the directory; the measured one is the restart.
    run_ours(&["--prompt-cache-dir", &dir])?;
    let restarted = run_ours(&["--prompt-cache-dir", &dir])?;

    println!(
        "{:>4} {:>7} {:>7} | {:>9} {:>9} {:>7} | {:>9} {:>7} | {:>9} {:>7}",
        "turn",
        "prompt",
        "cached",
        "mlx-lm",
        "ours",
        "ours/lm",
        "cache off",
        "off/ours",
        "restarted",
        "cached"
    );
    for (i, t) in warm.iter().enumerate() {
        let (lm, off, re) = (&reference[i], &off[i], &restarted[i]);
        println!(
            "{:>4} {:>7} {:>7} | {:>8.3}s {:>8.3}s {:>7.2} | {:>8.3}s {:>7.2} | {:>8.3}s {:>7}",
            i + 1,
            t.prompt_tokens.map_or("?".into(), |n| n.to_string()),
            t.cached_tokens.map_or("?".into(), |n| n.to_string()),
            lm.ttft,
            t.ttft,
            t.ttft / lm.ttft,
            off.ttft,
            off.ttft / t.ttft,
            re.ttft,
            re.cached_tokens.map_or("?".into(), |n| n.to_string()),
        );
    }
    let total = |turns: &[Turn]| turns.iter().map(|t| t.total).sum::<f64>();
    println!(
        "total: mlx-lm {:.2}s, ours {:.2}s ({:.2}x of mlx-lm), ours cache off {:.2}s, ours restarted {:.2}s",
        total(&reference),
        total(&warm),
        total(&warm) / total(&reference),
        total(&off),
        total(&restarted)
    );
    let same = warm
        .iter()
        .zip(&reference)
        .filter(|(o, r)| o.answer == r.answer)
        .count();
    println!(
        "answers equal to mlx-lm's: {same} of {} turns; load average {} at the end",
        warm.len(),
        load_average()
    );
    println!();
    let from_third: Vec<usize> = (2..warm.len()).collect();
    let faster = from_third
        .iter()
        .filter(|&&i| warm[i].ttft <= reference[i].ttft)
        .count();
    verdict(
        &format!(
            "from turn 3 on, our TTFT <= mlx-lm's ({faster} of {} turns)",
            from_third.len()
        ),
        faster == from_third.len(),
    );
    let longest = (0..warm.len())
        .max_by_key(|&i| warm[i].prompt_tokens.unwrap_or(i as u64))
        .unwrap_or(0);
    let gain = off[longest].ttft / warm[longest].ttft;
    verdict(
        &format!(
            "longest turn ({}): TTFT cache off / on = {gain:.1}x (target >= 5x)",
            longest + 1
        ),
        gain >= 5.0,
    );
    Ok(())
}
