//! A bounded soak of `mlx-spec serve` on loopback: eight clients, two API
//! keys, three ways to decode (plain, `prompt-lookup`, `suffix`),
//! streaming and not, cancellations half-way, and bad input of every kind
//! the trust-boundary review found, all at once, against a server with a
//! prompt-cache directory. What must hold:
//! - every completed greedy answer equals the prompt's solo plain answer;
//! - every bad input gets a 4xx, and nothing ever gets a 5xx;
//! - afterwards nothing is in flight and the resident memory is back near
//!   its level after warm-up (the prefix cache is bounded below it);
//! - a `kill -9` while entries are being written, then a restart on the
//!   same directory: no partial file survives, entries written before the
//!   kill are served again, answers are unchanged.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const KEYS: [&str; 2] = ["soak-key-one", "soak-key-two"];
const PROMPTS: [&str; 4] = [
    "Name three rivers of Europe.",
    "Repeat after me: the quick brown fox jumps over the lazy dog.",
    "What is two plus two?",
    "Write the word hello five times.",
];
const MAX_TOKENS: u64 = 12;

fn start(cache_dir: &Path) -> (Server, String) {
    let dir = cache_dir.to_string_lossy().into_owned();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0", "--prompt-cache-dir", &dir])
        .args(["--prompt-cache-bytes", "200000000"])
        .args([
            "--draft-provider",
            "prompt-lookup",
            "--draft-provider",
            "suffix",
        ])
        .args(["--max-concurrency", "12", "--max-batch", "4"])
        .args(["--api-key", KEYS[0], "--api-key", KEYS[1]])
        .env("MLX_SPEC_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let addr = common::served_address(&mut child);
    (Server(child), addr)
}

/// One raw HTTP/1.1 request (loopback, bounded by a read timeout).
fn send(addr: &str, key: &str, path: &str, body: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .expect("send the head");
    // A server may answer (413) and close before reading a large body.
    let _ = stream.write_all(body);
    stream
}

/// The status and the body of a whole response; no status when the
/// server closed the connection without answering.
fn try_exchange(addr: &str, key: &str, path: &str, body: &[u8]) -> (Option<u16>, String) {
    let mut stream = send(addr, key, path, body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let response = String::from_utf8_lossy(&raw).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok());
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// [`try_exchange`] where the server must answer.
fn exchange(addr: &str, key: &str, path: &str, body: &[u8]) -> (u16, String) {
    match try_exchange(addr, key, path, body) {
        (Some(status), body) => (status, body),
        (None, _) => panic!("no answer to a request on {path}"),
    }
}

fn chat_body(prompt: &str, speculative: &Value, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
        "speculative": speculative,
    })
}

/// The answer's text and `cached_tokens` (non-streamed).
fn answer(body: &str) -> (String, u64) {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {v}"))
        .to_owned();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (text, cached)
}

/// The text of a streamed answer (chunked transfer: the `data:` lines'
/// JSON is whole within a line).
fn streamed_text(body: &str) -> String {
    let mut text = String::new();
    let mut done = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        assert!(v.get("error").is_none(), "an error chunk: {v}");
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    assert!(done, "the stream did not end with [DONE]: {body}");
    text
}

/// A streamed request dropped after its first content chunk.
fn cancel_midway(addr: &str, key: &str, prompt: &str) {
    let body = chat_body(prompt, &json!({"provider": "prompt-lookup"}), true).to_string();
    let stream = send(addr, key, "/v1/chat/completions", body.as_bytes());
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line.starts_with("HTTP/1.1 ") {
            let status: u16 = line[9..12].parse().unwrap_or(0);
            assert!(status < 500, "a cancelled request got {line}");
        }
        if line.contains("\"content\":\"") && !line.contains("\"content\":\"\"") {
            return; // dropped here: the server must cancel the row
        }
    }
}

/// Bad requests of every kind found in review; each must get a 4xx (the
/// oversized body may instead be cut off unread: a server that answers 413
/// before the body arrives closes a connection still sending).
fn bad_inputs() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let chat = "/v1/chat/completions";
    let with = |patch: Value| {
        let mut body = chat_body(PROMPTS[0], &json!(false), false);
        for (k, v) in patch.as_object().expect("an object") {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    vec![
        ("malformed JSON", chat, b"{\"messages\": [".to_vec()),
        (
            "a drafter path in the request",
            chat,
            with(json!({"speculative": {"provider": "suffix", "model": "/etc"}})),
        ),
        (
            "a global-state size in the request",
            chat,
            with(json!({"speculative": {"provider": "suffix", "max_tree_tokens": 999999999}})),
        ),
        (
            "an unknown provider",
            chat,
            with(json!({"speculative": {"provider": "no-such"}})),
        ),
        (
            "inconsistent provider options",
            chat,
            with(
                json!({"speculative": {"provider": "prompt-lookup", "min_ngram": 9, "max_ngram": 3}}),
            ),
        ),
        ("max_tokens 0", chat, with(json!({"max_tokens": 0}))),
        (
            "max_tokens past the context",
            chat,
            with(json!({"max_tokens": 1000000})),
        ),
        ("temperature 5", chat, with(json!({"temperature": 5}))),
        ("an empty cache_salt", chat, with(json!({"cache_salt": ""}))),
        ("no messages", chat, with(json!({"messages": []}))),
        (
            "a 5 MB body",
            chat,
            with(json!({"messages": [{"role": "user", "content": "x".repeat(5 << 20)}]})),
        ),
        ("an unknown endpoint", "/v1/nothing", with(json!({}))),
    ]
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

fn partial_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read the cache dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect()
}

#[test]
fn many_clients_bad_input_cancels_and_a_kill_leave_answers_and_files_intact() {
    let cache = tempfile::tempdir().expect("tempdir");
    let (server, addr) = start(cache.path());
    let chat = "/v1/chat/completions";

    // Solo plain answers, one request at a time (also the warm-up).
    let solo: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let body = chat_body(p, &json!(false), false).to_string();
            let (status, body) = exchange(&addr, KEYS[0], chat, body.as_bytes());
            assert_eq!(status, 200, "{body}");
            answer(&body).0
        })
        .collect();
    let warm_rss = rss_bytes(server.0.id());

    let bad = Arc::new(bad_inputs());
    let completed = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let deadline = Instant::now() + Duration::from_secs(90);
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let (addr, solo, bad) = (addr.clone(), solo.clone(), Arc::clone(&bad));
            let (completed, refused, failures) = (
                Arc::clone(&completed),
                Arc::clone(&refused),
                Arc::clone(&failures),
            );
            std::thread::spawn(move || {
                for round in 0..9 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let key = KEYS[(client + round) % 2];
                    let which = (client * 7 + round * 3) % PROMPTS.len();
                    let speculative = [
                        json!(false),
                        json!({"provider": "prompt-lookup"}),
                        json!({"provider": "suffix"}),
                        json!({"provider": "prompt-lookup", "max_ngram": 3}),
                    ][(client + round) % 4]
                        .clone();
                    match (client + round * 5) % 6 {
                        0 => cancel_midway(&addr, key, PROMPTS[which]),
                        1 | 2 => {
                            let (name, path, body) = &bad[(client * 3 + round) % bad.len()];
                            let (status, text) = try_exchange(&addr, key, path, body);
                            let cut_off = status.is_none() && body.len() > 1 << 20;
                            if !cut_off && !status.is_some_and(|s| (400..500).contains(&s)) {
                                failures
                                    .lock()
                                    .expect("lock")
                                    .push(format!("{name}: {status:?} {text}"));
                            }
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        mode => {
                            let stream = mode == 3;
                            let body = chat_body(PROMPTS[which], &speculative, stream).to_string();
                            let (status, text) = exchange(&addr, key, chat, body.as_bytes());
                            if status == 429 {
                                continue; // at capacity: allowed, never a 5xx
                            }
                            let got = match status {
                                200 if stream => streamed_text(&text),
                                200 => answer(&text).0,
                                _ => {
                                    failures
                                        .lock()
                                        .expect("lock")
                                        .push(format!("{speculative} stream={stream}: {status} {text}"));
                                    continue;
                                }
                            };
                            if got != solo[which] {
                                failures.lock().expect("lock").push(format!(
                                    "{speculative} stream={stream} prompt {which}: {got:?} != solo {:?}",
                                    solo[which]
                                ));
                            }
                            completed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client panicked");
    }
    let failures = failures.lock().expect("lock").clone();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        completed.load(Ordering::Relaxed) >= 16,
        "too few completed answers"
    );
    assert!(
        refused.load(Ordering::Relaxed) >= 16,
        "too few bad inputs sent"
    );

    // Nothing left in flight (cancelled rows freed), memory back near its
    // warm level: the prefix cache is bounded at 200 MB, rows and streams
    // must not accumulate.
    let settle = Instant::now() + Duration::from_secs(30);
    while common::metric(&addr, "mlx_spec_in_flight") > 0.0 {
        assert!(
            Instant::now() < settle,
            "requests still in flight after the soak"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after_rss = rss_bytes(server.0.id());
    assert!(
        after_rss < warm_rss + (400 << 20),
        "resident memory grew from {warm_rss} to {after_rss} bytes"
    );

    // Entries being written when the server is killed outright.
    let fresh: Vec<_> = (0..3)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let prompt = format!("Give me one word that rhymes with cat, number {i}.");
                let body = chat_body(&prompt, &json!(false), false).to_string();
                exchange(&addr, KEYS[0], "/v1/chat/completions", body.as_bytes()).0
            })
        })
        .collect();
    for f in fresh {
        assert_eq!(f.join().expect("a request"), 200);
    }
    drop(server); // SIGKILL, then wait
    let (server, addr) = start(cache.path());
    assert_eq!(
        partial_files(cache.path()),
        Vec::<String>::new(),
        "a partial file survived the restart"
    );
    let body = chat_body(PROMPTS[0], &json!(false), false).to_string();
    let (status, text) = exchange(&addr, KEYS[0], chat, body.as_bytes());
    assert_eq!(status, 200, "{text}");
    let (again, cached) = answer(&text);
    assert_eq!(again, solo[0], "the answer after the restart");
    assert!(
        cached > 0,
        "an entry written before the kill was served again"
    );
    drop(server);
}
