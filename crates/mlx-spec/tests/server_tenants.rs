//! `mlx-spec serve` over loopback with two API keys and `suffix` kept per
//! tenant: a key's second request drafts from its first, another key's
//! request drafts nothing from it; a wrong key gets 401.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// POSTs `body` to `path` with `key`; the status and the JSON body.
fn post(addr: &str, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let (_, json) = response.split_once("\r\n\r\n").expect("a body");
    (status, serde_json::from_str(json).expect("a JSON body"))
}

#[test]
fn two_api_keys_do_not_share_the_suffix_global_tree() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args([
            "serve",
            "--port",
            "0",
            "--api-key",
            "key-alpha",
            "--api-key",
            "key-beta",
            "--draft-provider",
            "suffix",
            "--draft-option",
            "suffix:global_per_tenant=true",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let stdout = child.stdout.take().expect("stdout");
    let _server = Server(child);
    let mut first = String::new();
    BufReader::new(stdout)
        .read_line(&mut first)
        .expect("the address line");
    let addr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("no address in `{first}`"))
        .to_owned();
    let request = json!({
        "prompt": "List three primary colors as a JSON array of strings.",
        "max_tokens": 24,
        "temperature": 0,
    });
    let ask = |key: &str| {
        let (status, body) = post(&addr, "/v1/completions", key, &request);
        assert_eq!(status, 200, "{body}");
        let text = body["choices"][0]["text"]
            .as_str()
            .expect("text")
            .to_owned();
        let accepted = body["speculative"]["accepted"].as_u64().expect("stats");
        (text, accepted)
    };
    let (alpha_text, alpha_first) = ask("key-alpha");
    let (beta_text, beta_first) = ask("key-beta");
    let (again_text, alpha_second) = ask("key-alpha");
    assert_eq!(beta_text, alpha_text);
    assert_eq!(again_text, alpha_text);
    assert_eq!(beta_first, alpha_first, "beta drafted from alpha's request");
    assert!(
        alpha_second > alpha_first,
        "alpha's second request drafts from its first: {alpha_first} -> {alpha_second}"
    );
    let (status, body) = post(&addr, "/v1/completions", "key-gamma", &request);
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &json!("invalid_api_key"))
    );
}
