//! `mlx-spec serve` over loopback, at its edges: a server without API keys
//! answers only loopback names and `--allow-host` ones (DNS rebinding); a
//! key's `Bearer` scheme matches in any case; a body over
//! `--max-body-bytes` is a 413; a half-sent request and an idle keep-alive
//! connection are closed after `--header-timeout`; connections past
//! `--max-connections` are closed at once; SIGTERM stops a server holding
//! stalled connections within `--shutdown-grace`; a chat template that
//! loops forever is a 400 naming the template; a request past
//! `--request-timeout` is a 504 (a stream ends with the error), and the
//! engine is free for the next.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

use common::{served_address, tiny_llama_with_template};

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0"])
        .args(args)
        .env("MLX_SPEC_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = served_address(&mut child);
    (Server(child), addr)
}

/// Sends `raw` bytes and reads until the server closes (at most 60 s):
/// the status (0 when no answer came) and the whole answer.
fn exchange(addr: &str, raw: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    // A connection past the cap may be reset before the write.
    let _ = stream.write_all(raw.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

fn get(addr: &str, host: &str, auth: Option<&str>) -> (u16, String) {
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    exchange(
        addr,
        &format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"),
    )
}

fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    exchange(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The JSON body of an answer.
fn json_of(answer: &str) -> Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn hosts_keys_and_bodies_are_checked_at_the_door() {
    let (_open, addr) = start(&["--allow-host", "My.Box", "--max-body-bytes", "4096"]);
    let port = addr.rsplit(':').next().expect("port");
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "my.box".to_owned(),
        format!("MY.BOX:{port}"),
    ] {
        let (status, answer) = get(&addr, &host, None);
        assert_eq!(status, 200, "Host {host}: {answer}");
    }
    for host in ["evil.example", "localhost.evil.example:80", "127.0.0.2"] {
        let (status, answer) = get(&addr, host, None);
        assert_eq!(status, 403, "Host {host}: {answer}");
        assert_eq!(json_of(&answer)["error"]["code"], "host_not_allowed");
    }
    let (status, _) = exchange(&addr, "GET /v1/models HTTP/1.0\r\n\r\n");
    assert_eq!(status, 403, "a request without a Host header");

    let big = json!({"prompt": "w".repeat(5000), "max_tokens": 1}).to_string();
    let (status, answer) = post(&addr, "/v1/completions", &big);
    assert_eq!(status, 413, "{answer}");
    assert_eq!(json_of(&answer)["error"]["code"], "body_too_large");
    let (status, answer) = post(&addr, "/v1/completions", "{not json");
    assert_eq!(status, 400, "{answer}");

    // With API keys any Host is answered, and the scheme's case is free.
    let (_keyed, addr) = start(&["--api-key", "k-123"]);
    for auth in ["Bearer k-123", "bearer k-123", "BEARER  k-123"] {
        let (status, answer) = get(&addr, "evil.example", Some(auth));
        assert_eq!(status, 200, "{auth}: {answer}");
    }
    for auth in ["Bearer k-12", "Bearer k-1234", "Basic k-123", "Bearer"] {
        let (status, answer) = get(&addr, &addr, Some(auth));
        assert_eq!(status, 401, "{auth}: {answer}");
    }
}

/// `--allowed-origins`: a listed origin's preflight is answered (before any
/// key check: browsers send none with it) and its requests carry the CORS
/// header; other origins, and every origin without the flag, get none.
#[test]
fn only_allowed_origins_may_call_from_a_browser() {
    let (_keyed, addr) = start(&["--allowed-origins", "http://ui.test", "--api-key", "k-1"]);
    let preflight = |addr: &str, origin: &str| {
        exchange(
            addr,
            &format!(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type, authorization\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
    };
    let allowed = |answer: &str, origin: &str| {
        answer
            .to_ascii_lowercase()
            .contains(&format!("access-control-allow-origin: {origin}"))
    };
    let (status, answer) = preflight(&addr, "http://ui.test");
    assert_eq!(status, 200, "{answer}");
    assert!(allowed(&answer, "http://ui.test"), "{answer}");
    let models = |addr: &str, origin: &str| {
        exchange(
            addr,
            &format!(
                "GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\n\
                 Authorization: Bearer k-1\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let (status, answer) = models(&addr, "http://ui.test");
    assert_eq!(status, 200, "{answer}");
    assert!(allowed(&answer, "http://ui.test"), "{answer}");
    let (_, answer) = models(&addr, "http://evil.test");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{answer}"
    );

    let (_open, addr) = start(&[]);
    let (_, answer) = preflight(&addr, "http://ui.test");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{answer}"
    );
}

/// Reads until the server closes `stream`; how long that took.
fn closed_within(mut stream: TcpStream, limit: Duration) -> Duration {
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let begun = Instant::now();
    let mut sink = Vec::new();
    let _ = stream.read_to_end(&mut sink);
    begun.elapsed()
}

fn half_sent(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n").as_bytes())
        .expect("send");
    stream
}

#[test]
fn stalled_and_idle_connections_are_closed_and_capped() {
    let (_server, addr) = start(&["--header-timeout", "1", "--max-connections", "3"]);
    // A head never finished: closed after about a second.
    let took = closed_within(half_sent(&addr), Duration::from_secs(30));
    assert!(took < Duration::from_secs(10), "closed after {took:?}");

    // An idle keep-alive connection after an answer: closed too.
    let mut kept = TcpStream::connect(&addr).expect("connect");
    kept.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .expect("send");
    kept.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let begun = Instant::now();
    let mut answer = Vec::new();
    let _ = kept.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        begun.elapsed() < Duration::from_secs(10),
        "the idle connection stayed {:?}",
        begun.elapsed()
    );

    // Three stalled connections take every place: a fourth is closed
    // unanswered; once they time out, requests are answered again.
    let stalled: Vec<TcpStream> = (0..3).map(|_| half_sent(&addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, answer) = exchange(
        &addr,
        &format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(
        status, 0,
        "a connection past the cap was answered: {answer}"
    );
    for s in stalled {
        closed_within(s, Duration::from_secs(30));
    }
    let (status, answer) = get(&addr, &addr, None);
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn sigterm_stops_a_server_holding_stalled_connections() {
    let (mut server, addr) = start(&["--header-timeout", "120", "--shutdown-grace", "1"]);
    let stalled: Vec<TcpStream> = (0..50).map(|_| half_sent(&addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let pid = server.0.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(status.success());
    let begun = Instant::now();
    let exit = loop {
        if let Some(exit) = server.0.try_wait().expect("wait") {
            break exit;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(20),
            "the server did not stop within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
    drop(stalled);
}

/// A chat template with three nested loops of 100,000 steps each.
const RUNAWAY: &str = "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{{ '' }}{% endfor %}{% endfor %}{% endfor %}";

#[test]
fn a_runaway_template_is_a_400_and_a_long_request_a_504() {
    let dir = tempfile::tempdir().expect("tempdir");
    tiny_llama_with_template(dir.path(), RUNAWAY);
    let model = dir.path().to_string_lossy().into_owned();
    let (_server, addr) = start(&["--model", &model, "--request-timeout", "3"]);

    let chat = json!({"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 2});
    let (status, answer) = post(&addr, "/v1/chat/completions", &chat.to_string());
    assert_eq!(status, 400, "{answer}");
    let message = json_of(&answer)["error"]["message"].to_string();
    assert!(message.contains("chat template"), "{message}");

    // Far more tokens than three seconds allow, streamed and not, side by
    // side: each cut at the limit.
    let streamed_addr = addr.clone();
    let streamed = std::thread::spawn(move || {
        let body = json!({"prompt": "w1 w2 w3", "max_tokens": 1_000_000, "stream": true});
        post(&streamed_addr, "/v1/completions", &body.to_string())
    });
    let long = json!({"prompt": "w1 w2 w3", "max_tokens": 1_000_000, "temperature": 0});
    let begun = Instant::now();
    let (status, answer) = post(&addr, "/v1/completions", &long.to_string());
    assert_eq!(status, 504, "{answer}");
    assert_eq!(json_of(&answer)["error"]["code"], "request_timeout");
    assert!(
        begun.elapsed() < Duration::from_secs(60),
        "{:?}",
        begun.elapsed()
    );
    let (status, answer) = streamed.join().expect("the streamed request");
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");

    // The cancelled requests freed the engine.
    let short = json!({"prompt": "w1 w2 w3", "max_tokens": 3, "temperature": 0});
    let (status, answer) = post(&addr, "/v1/completions", &short.to_string());
    assert_eq!(status, 200, "{answer}");
}
