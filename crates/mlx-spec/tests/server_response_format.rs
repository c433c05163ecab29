//! `mlx-spec serve` over loopback: `response_format` (OpenAI's
//! `json_object` and `json_schema`, our `regex` and `grammar`) constrains
//! the answer, the same with and without speculation, streamed or not, on
//! both endpoints; a schema, regex or grammar the engine refuses is a 400
//! naming `response_format` before the request joins, and a good request
//! running beside it is unchanged.

use std::io::Read;

use serde_json::{json, Value};

mod common;

use common::{http_post, http_send, metric};

fn start() -> (common::Served, String) {
    common::serve(&["--max-batch", "4", "--draft-provider", "prompt-lookup"])
}

fn chat_body(question: &str, format: Value, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 48,
        "temperature": 0, "response_format": format});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

/// The answer's text and finish reason.
fn chat(addr: &str, body: &Value) -> (String, String) {
    let (status, answer) = http_post(addr, "/v1/chat/completions", body);
    assert_eq!(status, 200, "{body}: {answer}");
    let choice = &answer["choices"][0];
    (
        choice["message"]["content"]
            .as_str()
            .expect("content")
            .to_owned(),
        choice["finish_reason"]
            .as_str()
            .expect("finish_reason")
            .to_owned(),
    )
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"], "additionalProperties": false})
}

#[test]
fn json_schema_and_json_object_answers_parse_and_speculation_changes_nothing() {
    let (_server, addr) = start();
    let format = json!({"type": "json_schema", "json_schema": {"name": "place", "schema": schema(), "strict": true}});
    let question = "Name the capital of France and its country as JSON.";
    let (text, finish) = chat(
        &addr,
        &chat_body(question, format.clone(), json!({"speculative": false})),
    );
    assert_eq!(finish, "stop", "{text}");
    let value: Value = serde_json::from_str(&text).expect("the answer is JSON");
    let object = value.as_object().expect("an object");
    assert!(
        object.keys().all(|k| k == "city" || k == "country"),
        "{text}"
    );
    assert!(
        object["city"].is_string() && object["country"].is_string(),
        "{text}"
    );
    let (speculated, _) = chat(
        &addr,
        &chat_body(
            question,
            format.clone(),
            json!({"speculative": {"provider": "prompt-lookup", "num_draft_tokens": 4, "min_ngram": 1}}),
        ),
    );
    assert_eq!(speculated, text);
    // The constraint's work is counted: two requests, their tokens, masks
    // and time, and forced drafts (the keys after `{"`).
    assert_eq!(metric(&addr, "mlx_spec_constrained_requests_total"), 2.0);
    assert!(metric(&addr, "mlx_spec_constrained_tokens_total") >= 2.0 * 4.0);
    assert!(metric(&addr, "mlx_spec_constraint_masks_total") >= 8.0);
    assert!(metric(&addr, "mlx_spec_constraint_grammar_microseconds_total") > 0.0);
    assert!(metric(&addr, "mlx_spec_constraint_mask_apply_microseconds_total") > 0.0);
    assert!(metric(&addr, "mlx_spec_forced_accepted_total") >= 1.0);

    // Streamed: the same text; its log-probabilities come from the masked
    // distribution (no refused token is among the likeliest with a weight).
    let mut raw = String::new();
    http_send(
        &addr,
        "POST",
        "/v1/chat/completions",
        &chat_body(
            question,
            format,
            json!({"stream": true, "speculative": false, "logprobs": true, "top_logprobs": 3}),
        )
        .to_string(),
    )
    .read_to_string(&mut raw)
    .expect("read the stream");
    let chunks: Vec<Value> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str(d).expect("a chunk"))
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    for entry in chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
    {
        let mass: f64 = entry["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .map(|t| t["logprob"].as_f64().expect("lp").exp())
            .sum();
        assert!(mass <= 1.0 + 1e-4, "{entry}");
    }

    let (object, _) = chat(
        &addr,
        &chat_body(
            "Describe a cat as JSON.",
            json!({"type": "json_object"}),
            json!({"max_tokens": 64}),
        ),
    );
    // A JSON object, or (cut by max_tokens) the start of one.
    assert!(object.trim_start().starts_with('{'), "{object}");
}

#[test]
fn regex_and_lark_grammar_extensions_on_both_endpoints() {
    let (_server, addr) = start();
    let (digits, finish) = chat(
        &addr,
        &chat_body(
            "Pick a number.",
            json!({"type": "regex", "regex": "[0-9]{3}"}),
            json!({}),
        ),
    );
    assert!(
        digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()),
        "{digits}"
    );
    assert_eq!(finish, "stop");
    let (answer, _) = chat(
        &addr,
        &chat_body(
            "Is Paris in France?",
            json!({"type": "grammar", "grammar": "start: \"yes\" | \"no\""}),
            json!({}),
        ),
    );
    assert!(answer == "yes" || answer == "no", "{answer}");
    let (status, completion) = http_post(
        &addr,
        "/v1/completions",
        &json!({"prompt": "The year the Eiffel Tower was finished:", "max_tokens": 8, "temperature": 0,
            "response_format": {"type": "regex", "regex": " ?[0-9]{4}"}}),
    );
    assert_eq!(status, 200, "{completion}");
    let text = completion["choices"][0]["text"].as_str().expect("text");
    assert_eq!(text.trim().len(), 4, "{text}");
    assert!(text.trim().bytes().all(|b| b.is_ascii_digit()), "{text}");
}

#[test]
fn bad_schemas_grammars_and_regexes_are_400s_before_the_request_joins() {
    let (_server, addr) = start();
    let good = json!({"prompt": "Write a short poem about the sea.", "max_tokens": 24, "temperature": 0,
        "speculative": false});
    let (status, alone) = http_post(&addr, "/v1/completions", &good);
    assert_eq!(status, 200, "{alone}");
    let bad = [
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                "properties": {"a": {"type": "no-such-type"}}}}}),
            "JSON schema",
        ),
        (json!({"type": "regex", "regex": "[0-9"}), "regex"),
        (
            json!({"type": "grammar", "grammar": "start: ("}),
            "Lark grammar",
        ),
        (
            json!({"type": "grammar", "grammar": "start: undefined_rule"}),
            "Lark grammar",
        ),
    ];
    let (together, refusals) = std::thread::scope(|scope| {
        let runner = scope.spawn(|| http_post(&addr, "/v1/completions", &good));
        let refusals: Vec<(u16, Value)> = bad
            .iter()
            .map(|(format, _)| {
                http_post(
                    &addr,
                    "/v1/chat/completions",
                    &chat_body("hi", format.clone(), json!({})),
                )
            })
            .collect();
        (runner.join().expect("the good request"), refusals)
    });
    for ((format, names), (status, answer)) in bad.iter().zip(&refusals) {
        assert_eq!(*status, 400, "{format}: {answer}");
        assert_eq!(answer["error"]["param"], "response_format", "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains(names), "{format}: {message}");
    }
    assert_eq!(together.0, 200, "{}", together.1);
    assert_eq!(
        together.1["choices"][0]["text"],
        alone["choices"][0]["text"]
    );
    assert_eq!(metric(&addr, "mlx_spec_engine_held"), 0.0);
}
