//! `mlx-spec serve` on the engine facade, over loopback: concurrent
//! requests (plain, a loaded provider, a provider built for the request's
//! own options) answer what each answers alone; a streaming client that
//! disconnects mid-generation frees its row promptly; a prompt plus
//! `max_tokens` past the context is refused with a 400 naming both.

use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

mod common;

use common::{http_post, metric, served_address, stream_chunks, wait_engine_idle};

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
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = served_address(&mut child);
    (Server(child), addr)
}

/// POSTs `body` to `/v1/completions`; the status and the JSON body.
fn post(addr: &str, body: &Value) -> (u16, Value) {
    http_post(addr, "/v1/completions", body)
}

fn completion(prompt: &str, speculative: Value) -> Value {
    json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "speculative": speculative})
}

#[test]
fn concurrent_requests_answer_as_alone_and_a_disconnect_frees_its_row() {
    let (_server, addr) = start(&["--max-batch", "4", "--draft-provider", "prompt-lookup"]);
    let asks = [
        completion(
            "List three primary colors as a JSON array of strings.",
            json!(false),
        ),
        completion(
            "Repeat after me: the quick brown fox jumps over the lazy dog.",
            json!({"provider": "prompt-lookup"}),
        ),
        completion(
            "Repeat after me: the quick brown fox jumps over the lazy dog.",
            json!({"provider": "prompt-lookup", "max_ngram": 2}),
        ),
        completion(
            "Count from one to ten in words.",
            json!({"provider": "prompt-lookup", "num_draft_tokens": 2}),
        ),
    ];
    let alone: Vec<String> = asks
        .iter()
        .map(|ask| {
            let (status, body) = post(&addr, ask);
            assert_eq!(status, 200, "{body}");
            body["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_owned()
        })
        .collect();
    let together: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let threads: Vec<_> = asks
            .iter()
            .map(|ask| scope.spawn(|| post(&addr, ask)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a client thread"))
            .collect()
    });
    for (i, ((status, body), alone)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(
            body["choices"][0]["text"].as_str(),
            Some(alone.as_str()),
            "request {i}"
        );
    }
    assert!(metric(&addr, "mlx_spec_rows_per_step_count") > 0.0);

    // A streaming client reads its first chunk, then goes away.
    let body = json!({"prompt": "Once upon a time, in a land far away, there lived a dragon who", "max_tokens": 400,
        "temperature": 0, "stream": true, "speculative": false});
    let reader = stream_chunks(&addr, "/v1/completions", &body, 2);
    assert_eq!(
        metric(&addr, "mlx_spec_engine_held"),
        1.0,
        "still generating"
    );
    drop(reader);
    wait_engine_idle(&addr);
    assert_eq!(metric(&addr, "mlx_spec_client_disconnects_total"), 1.0);
    assert!(
        metric(&addr, "mlx_spec_generated_tokens_total") < (24 * 8 + 400) as f64,
        "the disconnected request did not run to its max_tokens"
    );
}

#[test]
fn prompt_plus_max_tokens_past_the_context_is_a_400_naming_both() {
    let (_server, addr) = start(&[]);
    let (status, body) = post(&addr, &json!({"prompt": "Hello there", "max_tokens": 9000}));
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("max_tokens (9000)") && message.contains("8192"),
        "{message}"
    );
    assert_eq!(metric(&addr, "mlx_spec_engine_held"), 0.0);
}

#[test]
fn a_repeated_prompt_is_served_from_the_prefix_cache_and_reported() {
    let (_server, addr) = start(&[]);
    let ask = completion(
        "Name the largest planet of the solar system in one word.",
        json!(false),
    );
    let (status, first) = post(&addr, &ask);
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        first["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{first}"
    );
    let (status, second) = post(&addr, &ask);
    assert_eq!(status, 200, "{second}");
    // A repeat reuses every prompt token but the last, which must run.
    let prompt_tokens = second["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt_tokens - 1),
        "{second}"
    );
    assert_eq!(first["choices"][0]["text"], second["choices"][0]["text"]);
    assert_eq!(metric(&addr, "mlx_spec_prefix_cache_hits_total"), 1.0);
    assert_eq!(
        metric(&addr, "mlx_spec_prefix_cache_tokens_total"),
        (prompt_tokens - 1) as f64
    );
    assert!(metric(&addr, "mlx_spec_prefix_cache_bytes") > 0.0);

    let (_server, addr) = start(&["--prompt-cache-bytes", "0"]);
    post(&addr, &ask);
    let (_, again) = post(&addr, &ask);
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{again}"
    );
    assert_eq!(metric(&addr, "mlx_spec_prefix_cache_hits_total"), 0.0);
}
