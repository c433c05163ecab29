//! `mlx-spec serve` over loopback: log-probabilities in OpenAI's shapes
//! (chat's `content` list, the completions API's legacy columns, streamed
//! per delta), equal with and without speculation and batching;
//! `logit_bias` as OpenAI defines it; out-of-range values and bad
//! `response_format`s are 400s naming the field, and a good request
//! running beside them is unchanged.

use std::io::Read;

use serde_json::{json, Value};

mod common;

use common::{http_post, http_send, metric};

fn start() -> (common::Served, String) {
    common::serve(&["--max-batch", "4", "--draft-provider", "prompt-lookup"])
}

fn chat(addr: &str, body: Value) -> Value {
    let (status, answer) = http_post(addr, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{body}: {answer}");
    answer
}

fn complete(addr: &str, body: Value) -> Value {
    let (status, answer) = http_post(addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{body}: {answer}");
    answer
}

/// The `data:` objects of an SSE answer, up to `[DONE]`.
fn stream(addr: &str, path: &str, body: &Value) -> Vec<Value> {
    let mut raw = String::new();
    http_send(addr, "POST", path, &body.to_string())
        .read_to_string(&mut raw)
        .expect("read the stream");
    assert!(raw.contains("data: [DONE]"), "{raw}");
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str(d).expect("a JSON chunk"))
        .collect()
}

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

fn ask(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12,
        "temperature": 0, "logprobs": true, "top_logprobs": 5});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

/// `(id, logprob)` of each content entry.
fn chosen(answer: &Value) -> Vec<(u64, f64)> {
    answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .iter()
        .map(|e| {
            (
                e["id"].as_u64().expect("id"),
                e["logprob"].as_f64().expect("logprob"),
            )
        })
        .collect()
}

#[test]
fn chat_logprobs_are_consistent_and_unchanged_by_speculation() {
    let (_server, addr) = start();
    let plain = chat(&addr, ask(json!({"speculative": false})));
    let content = plain["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(
        content.len() as u64,
        plain["usage"]["completion_tokens"].as_u64().expect("usage"),
        "one entry per generated token"
    );
    let mut bytes = Vec::new();
    for entry in content {
        let lp = entry["logprob"].as_f64().expect("logprob");
        assert!(lp <= 0.0, "{entry}");
        let top = entry["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 5, "{entry}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["id"], entry["id"], "{entry}");
        assert!((top[0]["logprob"].as_f64().expect("lp") - lp).abs() < 1e-5);
        let lps: Vec<f64> = top
            .iter()
            .map(|t| t["logprob"].as_f64().expect("lp"))
            .collect();
        assert!(
            lps.windows(2).all(|w| w[0] >= w[1]),
            "most likely first: {lps:?}"
        );
        let mass: f64 = lps.iter().map(|l| l.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "{mass}");
        for b in entry["bytes"].as_array().expect("bytes") {
            bytes.push(b.as_u64().expect("a byte") as u8);
        }
    }
    assert_eq!(
        String::from_utf8(bytes).expect("utf-8"),
        plain["choices"][0]["message"]["content"]
            .as_str()
            .expect("content"),
        "the tokens' bytes spell the answer"
    );
    let speculated = chat(
        &addr,
        ask(
            json!({"speculative": {"provider": "prompt-lookup", "num_draft_tokens": 3, "min_ngram": 1}}),
        ),
    );
    assert_eq!(speculated["speculative"]["provider"], "prompt-lookup");
    // `timings`: the answer's later tokens at the rate they came.
    for answer in [&plain, &speculated] {
        let t = &answer["timings"];
        let (prompt, generation) = (
            t["prompt_seconds"].as_f64().expect("prompt_seconds"),
            t["generation_seconds"]
                .as_f64()
                .expect("generation_seconds"),
        );
        let later = answer["usage"]["completion_tokens"]
            .as_f64()
            .expect("usage")
            - 1.0;
        assert!(prompt > 0.0 && generation > 0.0, "{t}");
        let rate = t["generation_tokens_per_second"].as_f64().expect("rate");
        assert!(
            (rate - later / generation).abs() < 1e-6 * rate.max(1.0),
            "{t}"
        );
    }
    let (a, b) = (chosen(&plain), chosen(&speculated));
    assert_eq!(
        a.iter().map(|x| x.0).collect::<Vec<_>>(),
        b.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    for ((_, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-3, "{a:?} vs {b:?}");
    }

    // Batched: three at once (one step's rows) report what one alone does.
    let together: Vec<Value> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| chat(&addr, ask(json!({"speculative": false})))))
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a client"))
            .collect()
    });
    for answer in &together {
        let batched = chosen(answer);
        assert_eq!(
            batched.iter().map(|x| x.0).collect::<Vec<_>>(),
            a.iter().map(|x| x.0).collect::<Vec<_>>()
        );
        for ((_, x), (_, y)) in a.iter().zip(&batched) {
            assert!((x - y).abs() < 1e-3, "{a:?} vs {batched:?}");
        }
    }

    // Streamed: the same entries, spread over the deltas.
    let chunks = stream(
        &addr,
        "/v1/chat/completions",
        &ask(json!({"stream": true, "speculative": false})),
    );
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&streamed, content);
}

#[test]
fn completions_logprobs_take_the_legacy_shape_streamed_or_not() {
    let (_server, addr) = start();
    let body = json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
        "logprobs": 3, "speculative": false});
    let answer = complete(&addr, body.clone());
    let lp = &answer["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("a token"))
        .collect();
    let n = tokens.len();
    assert_eq!(
        n as u64,
        answer["usage"]["completion_tokens"]
            .as_u64()
            .expect("usage")
    );
    assert_eq!(
        tokens.concat(),
        answer["choices"][0]["text"].as_str().expect("text")
    );
    for key in ["token_logprobs", "top_logprobs", "text_offset", "token_ids"] {
        assert_eq!(lp[key].as_array().map(Vec::len), Some(n), "{key}: {lp}");
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|o| o.as_u64().expect("an offset"))
        .collect();
    let mut at = 0;
    for (token, offset) in tokens.iter().zip(&offsets) {
        assert_eq!(*offset, at);
        at += token.chars().count() as u64;
    }
    for (top, chosen) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .zip(lp["token_logprobs"].as_array().expect("logprobs"))
    {
        let top = top.as_object().expect("a token -> logprob map");
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().expect("lp"))
            .fold(f64::NEG_INFINITY, f64::max);
        assert!((best - chosen.as_f64().expect("lp")).abs() < 1e-5);
    }
    let mut streamed = json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [], "token_ids": []});
    for chunk in stream(
        &addr,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 8,
        "temperature": 0, "logprobs": 3, "speculative": false, "stream": true}),
    ) {
        let part = &chunk["choices"][0]["logprobs"];
        if part.is_null() {
            continue;
        }
        for key in [
            "tokens",
            "token_logprobs",
            "top_logprobs",
            "text_offset",
            "token_ids",
        ] {
            let more = part[key].as_array().expect("a column").clone();
            streamed[key].as_array_mut().expect("column").extend(more);
        }
    }
    for key in [
        "tokens",
        "token_logprobs",
        "top_logprobs",
        "text_offset",
        "token_ids",
    ] {
        assert_eq!(streamed[key], lp[key], "{key}");
    }
}

#[test]
fn logit_bias_bans_and_forces_tokens_with_and_without_speculation() {
    let (_server, addr) = start();
    let body = |bias: Value, speculative: Value| {
        json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "logit_bias": bias, "speculative": speculative})
    };
    let ids = |answer: &Value| -> Vec<u64> {
        answer["choices"][0]["logprobs"]["token_ids"]
            .as_array()
            .expect("token_ids")
            .iter()
            .map(|t| t.as_u64().expect("an id"))
            .collect()
    };
    let free = ids(&complete(&addr, body(json!({}), json!(false))));
    let first = free[0];
    let banned = ids(&complete(
        &addr,
        body(json!({first.to_string(): -100}), json!(false)),
    ));
    assert_ne!(banned[0], first, "-100 bans the greedy token");
    assert!(!banned.contains(&first));
    // +100 on a token no answer above starts with: every position takes it.
    let forced_id = 1000u64;
    let forced = complete(
        &addr,
        body(json!({forced_id.to_string(): 100}), json!(false)),
    );
    assert_eq!(ids(&forced), vec![forced_id; 6], "{forced}");
    // Composed with speculation: the same tokens.
    let spec = json!({"provider": "prompt-lookup", "num_draft_tokens": 3, "min_ngram": 1});
    assert_eq!(
        ids(&complete(
            &addr,
            body(json!({first.to_string(): -100}), spec.clone())
        )),
        banned
    );
    assert_eq!(
        ids(&complete(
            &addr,
            body(json!({forced_id.to_string(): 100}), spec)
        )),
        vec![forced_id; 6]
    );
}

#[test]
fn out_of_range_values_are_400s_and_a_concurrent_request_is_unchanged() {
    let (_server, addr) = start();
    let good = json!({"prompt": "Write a short poem about the sea.", "max_tokens": 24, "temperature": 0,
        "speculative": false});
    let alone = complete(&addr, good.clone());
    let chat_q = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        if let (Some(b), Value::Object(extra)) = (b.as_object_mut(), extra) {
            b.extend(extra);
        }
        b
    };
    let bad = [
        (
            "/v1/chat/completions",
            chat_q(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat_q(json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat_q(json!({"logprobs": 3})),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            chat_q(json!({"logit_bias": {"0": 101}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat_q(json!({"logit_bias": {"hello": 1}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat_q(json!({"logit_bias": {"99999999": 1}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat_q(json!({"response_format": {"type": "xml"}})),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat_q(
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
            ),
            "response_format",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logit_bias": {"1": -100.5}}),
            "logit_bias",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "response_format": {"type": "regex"}}),
            "response_format",
        ),
    ];
    let (together, refusals) = std::thread::scope(|scope| {
        let runner = scope.spawn(|| complete(&addr, good.clone()));
        let refusals: Vec<(u16, Value)> = bad
            .iter()
            .map(|(path, body, _)| http_post(&addr, path, body))
            .collect();
        (runner.join().expect("the good request"), refusals)
    });
    for ((path, body, param), (status, answer)) in bad.iter().zip(&refusals) {
        assert_eq!(*status, 400, "{path} {body}: {answer}");
        assert_eq!(answer["error"]["param"], *param, "{path} {body}: {answer}");
    }
    assert_eq!(together["choices"][0]["text"], alone["choices"][0]["text"]);
    assert_eq!(metric(&addr, "mlx_spec_engine_held"), 0.0);
}
