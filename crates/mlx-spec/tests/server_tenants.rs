//! `mlx-spec serve` over loopback: what one request or tenant may reach.
//! Two API keys: `suffix` kept per tenant (a key's second request drafts
//! from its first, another key's drafts nothing from it), the prefix cache
//! partitioned per key and `cache_salt`, a per-key concurrency limit, a
//! wrong key 401; a request's provider options checked against what a
//! request may set; the Responses API's stored responses read, continued
//! and deleted only by the key that stored them.

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
    send(addr, "POST", path, key, &body.to_string())
}

/// Sends `method path` with `key` and `body`; the status and the JSON body.
fn send(addr: &str, method: &str, path: &str, key: &str, body: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
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

/// The server's `mlx_spec_in_flight` gauge.
fn in_flight(addr: &str) -> u64 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
        .lines()
        .find_map(|l| l.strip_prefix("mlx_spec_in_flight "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the in-flight gauge")
}

/// Starts `mlx-spec serve --port 0 ARGS` on loopback; the server and its
/// address.
fn start(args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let stdout = child.stdout.take().expect("stdout");
    let server = Server(child);
    let mut first = String::new();
    BufReader::new(stdout)
        .read_line(&mut first)
        .expect("the address line");
    let addr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("no address in `{first}`"))
        .to_owned();
    (server, addr)
}

const KEYS: [&str; 4] = ["--api-key", "key-alpha", "--api-key", "key-beta"];

/// Both the explicit option and the default keep the trees apart (a
/// request cannot turn it off: `global_per_tenant` is the operator's).
#[test]
fn two_api_keys_do_not_share_the_suffix_global_tree() {
    for extra in [
        &["--draft-option", "suffix:global_per_tenant=true"][..],
        &[][..],
    ] {
        let mut args = KEYS.to_vec();
        args.extend(["--draft-provider", "suffix"]);
        args.extend(extra);
        suffix_trees_kept_apart(&args);
    }
}

fn suffix_trees_kept_apart(args: &[&str]) {
    let (_server, addr) = start(args);
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

/// Found on a live server: with two keys, bob sending alice's system
/// prompt with a guessed secret got `cached_tokens` telling how many of
/// its tokens matched alice's. Each key now has a partition of its own;
/// `cache_salt` partitions further; `--share-prefix-cache` opts in to
/// sharing (so the test would fail if partitions did nothing).
#[test]
fn a_key_learns_nothing_from_another_keys_cached_prefix() {
    let secret = |code: &str| {
        json!({
            "messages": [
                {"role": "system", "content": format!("The vault code is {code}. Never tell anyone the vault code.")},
                {"role": "user", "content": "Say hello."},
            ],
            "max_tokens": 2,
            "temperature": 0,
        })
    };
    let cached = |addr: &str, key: &str, body: &Value| {
        let (status, body) = post(addr, "/v1/chat/completions", key, body);
        assert_eq!(status, 200, "{body}");
        body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens")
    };
    let (server, addr) = start(&KEYS);
    assert_eq!(cached(&addr, "key-alpha", &secret("7431")), 0, "cold");
    assert!(
        cached(&addr, "key-alpha", &secret("7431")) > 0,
        "a key reuses its own prefix"
    );
    // Alpha's entry is invisible to beta: its first request, the right
    // guess, prefills everything (on today's main: 28 of 29 cached).
    assert_eq!(cached(&addr, "key-beta", &secret("7431")), 0, "the truth");
    let mut salted = secret("7431");
    salted["cache_salt"] = json!("project-x");
    assert_eq!(cached(&addr, "key-alpha", &salted), 0, "a salt partitions");
    assert!(cached(&addr, "key-alpha", &salted) > 0);
    let mut bad = secret("7431");
    bad["cache_salt"] = json!("");
    let (status, body) = post(&addr, "/v1/chat/completions", "key-alpha", &bad);
    assert_eq!(
        (status, &body["error"]["param"]),
        (400, &json!("cache_salt"))
    );
    drop(server);

    let mut shared = KEYS.to_vec();
    shared.push("--share-prefix-cache");
    let (_server, addr) = start(&shared);
    assert_eq!(cached(&addr, "key-alpha", &secret("7431")), 0);
    assert!(
        cached(&addr, "key-beta", &secret("7431")) > 0,
        "the operator shared the cache"
    );
}

/// One key cannot hold every slot: past `--max-concurrency-per-key` its
/// requests get 429 while another key's still run, and a stream its
/// client leaves gives its slot back.
#[test]
fn one_key_cannot_take_every_slot() {
    let mut args = KEYS.to_vec();
    args.extend(["--max-concurrency-per-key", "1", "--max-concurrency", "4"]);
    let (_server, addr) = start(&args);
    // Alpha's long request, streamed so that the test can leave it: its
    // slot must come back when the client goes away.
    let long = json!({"prompt": "Count from one to one hundred:", "max_tokens": 1000,
        "temperature": 0, "stream": true})
    .to_string();
    let mut busy = TcpStream::connect(&addr).expect("connect");
    write!(
        busy,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer key-alpha\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{long}",
        long.len()
    )
    .expect("send");
    let short = json!({"prompt": "Hi", "max_tokens": 1, "temperature": 0});
    // Wait until alpha's long request is in flight (the gauge), then ask
    // again with the same key.
    let settled = |want: u64, what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while in_flight(&addr) != want {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    settled(1, "the long request never started");
    let (status, refused) = post(&addr, "/v1/completions", "key-alpha", &short);
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("per-key limit")),
        "{refused}"
    );
    let (status, body) = post(&addr, "/v1/completions", "key-beta", &short);
    assert_eq!(status, 200, "another key still gets a slot: {body}");
    let mut head = [0u8; 12];
    busy.read_exact(&mut head)
        .expect("the stream's status line");
    assert_eq!(&head, b"HTTP/1.1 200");
    drop(busy);
    // The key's place is the client's: it is free once the answer's gauge
    // drops (before, the engine freed it a step later, and a "stop" and a
    // new message was a 429).
    settled(0, "the abandoned stream stayed in flight");
    let (status, body) = post(&addr, "/v1/completions", "key-alpha", &short);
    assert_eq!(status, 200, "alpha's slot came back: {body}");
}

/// A request's provider options: operator options (paths, model
/// directories, global-state sizes) are a 400 naming the option, before
/// anything is built (found: `"model": "/etc"` made the engine try to load
/// `/etc` and answer 500); options each in range that the provider refuses
/// together are a 400 too, not a 500; a valid request option works.
#[test]
fn request_options_are_checked_and_never_name_files() {
    let (_server, addr) = start(&[
        "--draft-provider",
        "prompt-lookup",
        "--draft-provider",
        "suffix",
    ]);
    let ask = |spec: Value| {
        let body = json!({"prompt": "a b c a b c a b", "max_tokens": 4, "temperature": 0, "speculative": spec});
        post(&addr, "/v1/completions", "unused", &body)
    };
    for (spec, fragment) in [
        (
            json!({"provider": "suffix", "model": "/etc"}),
            "option `model`",
        ),
        (
            json!({"provider": "suffix", "max_depth": 200}),
            "option `max_depth`",
        ),
        (
            json!({"provider": "prompt-lookup", "max_ngram": 99}),
            "option `max_ngram`",
        ),
        (
            json!({"provider": "prompt-lookup", "min_ngram": 8, "max_ngram": 2}),
            "prompt-lookup",
        ),
    ] {
        let (status, body) = ask(spec.clone());
        assert_eq!(status, 400, "{spec}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(fragment), "{spec}: {message}");
        assert_eq!(body["error"]["param"], json!("speculative"), "{spec}");
    }
    let (status, body) = ask(json!({"provider": "prompt-lookup", "max_ngram": 3}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["speculative"]["provider"], json!("prompt-lookup"));
}

/// A stored response is another key's secret: it can neither read it,
/// continue it, delete it nor learn that it exists; its own key does all
/// three, and `store: false` keeps nothing.
#[test]
fn a_key_cannot_reach_another_keys_stored_responses() {
    let (_server, addr) = start(&KEYS);
    let ask = |key: &str, extra: Value| {
        let mut body = json!({"input": "My locker code is 4417. Reply OK.",
            "max_output_tokens": 3, "temperature": 0});
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        post(&addr, "/v1/responses", key, &body)
    };
    let (status, first) = ask("key-alpha", json!({}));
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().expect("an id").to_owned();
    let path = format!("/v1/responses/{id}");
    let not_found = |(status, body): (u16, Value)| {
        assert_eq!(status, 404, "{body}");
        assert!(
            !body.to_string().contains("4417"),
            "nothing of the response leaks: {body}"
        );
        body
    };
    // The other key: the same 404 as for an id never stored.
    let other = not_found(send(&addr, "GET", &path, "key-beta", ""));
    let never = not_found(send(&addr, "GET", "/v1/responses/resp_0", "key-beta", ""));
    assert_eq!(
        other["error"]["code"], never["error"]["code"],
        "{other} {never}"
    );
    let continued = not_found(ask(
        "key-beta",
        json!({"previous_response_id": id, "input": "What is my locker code?"}),
    ));
    assert_eq!(
        continued["error"]["code"],
        json!("previous_response_not_found")
    );
    not_found(send(&addr, "DELETE", &path, "key-beta", ""));
    let items_path = format!("{path}/input_items");
    not_found(send(&addr, "GET", &items_path, "key-beta", ""));
    let (status, items) = send(&addr, "GET", &items_path, "key-alpha", "");
    assert_eq!(status, 200, "{items}");
    assert_eq!(
        items["data"][0]["content"][0]["text"],
        json!("My locker code is 4417. Reply OK."),
        "{items}"
    );
    let follow_up = json!({"previous_response_id": id, "input": "What is my locker code?"});
    not_found(post(
        &addr,
        "/v1/responses/input_tokens",
        "key-beta",
        &follow_up,
    ));
    // Its own key reads and continues it (the history is in the prompt,
    // counted beforehand as the answer's usage says).
    let (status, stored) = send(&addr, "GET", &path, "key-alpha", "");
    assert_eq!((status, &stored), (200, &first));
    let (status, next) = ask(
        "key-alpha",
        json!({"previous_response_id": id, "input": "What is my locker code?"}),
    );
    assert_eq!(status, 200, "{next}");
    let tokens = |r: &Value| r["usage"]["input_tokens"].as_u64().unwrap_or(0);
    assert!(tokens(&next) > tokens(&first) + 8, "{first} {next}");
    let (status, counted) = post(&addr, "/v1/responses/input_tokens", "key-alpha", &follow_up);
    assert_eq!(status, 200, "{counted}");
    assert_eq!(
        counted,
        json!({"object": "response.input_tokens", "input_tokens": tokens(&next)})
    );
    // `store: false` keeps nothing; a deleted response is gone for good.
    let (_, unstored) = ask("key-alpha", json!({"store": false}));
    let unstored_path = format!("/v1/responses/{}", unstored["id"].as_str().unwrap_or(""));
    not_found(send(&addr, "GET", &unstored_path, "key-alpha", ""));
    let (status, deleted) = send(&addr, "DELETE", &path, "key-alpha", "");
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    not_found(send(&addr, "GET", &path, "key-alpha", ""));
    not_found(ask("key-alpha", json!({"previous_response_id": id})));
}
