//! `mlx-spec serve` over loopback through Anthropic's Messages API: a
//! text answer and the same answer streamed (events in Anthropic's order),
//! `count_tokens` equal to the answer's prompt, a forced `tool_use` whose
//! input follows its schema and a `tool_result` turn after it, the same
//! tokens with speculation (prompt lookup, suffix) as without, bad requests
//! as 400s in Anthropic's shape naming the field, `x-api-key` and bearer
//! keys, errors past the request timeout, and a thinking template's
//! reasoning as thinking blocks (`thinking: disabled` reaching it).

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};

mod common;

const KEY: &str = "messages-key";

fn start() -> (common::Served, String) {
    common::serve(&[
        "--max-batch",
        "4",
        "--draft-provider",
        "prompt-lookup",
        "--draft-provider",
        "suffix",
        "--api-key",
        KEY,
    ])
}

/// POSTs `body` to `path` with `auth` (a header line, or none): the
/// status and the body's text.
fn post(addr: &str, path: &str, body: &Value, auth: Option<&str>) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .expect("timeout");
    let body = body.to_string();
    let auth = auth.map(|a| format!("{a}\r\n")).unwrap_or_default();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}\
         anthropic-version: 2023-06-01\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
    let (_, text) = response.split_once("\r\n\r\n").expect("a body");
    (status, text.to_owned())
}

/// A JSON answer from `/v1/messages` (with the key as `x-api-key`).
fn message(addr: &str, body: &Value) -> Value {
    let (status, text) = post(
        addr,
        "/v1/messages",
        body,
        Some(&format!("x-api-key: {KEY}")),
    );
    assert_eq!(status, 200, "{body}: {text}");
    serde_json::from_str(&text).expect("a JSON message")
}

/// The `(event, data)` pairs of a streamed answer (chunked transfer
/// framing skipped: only `event:` and `data:` lines are read).
fn events(addr: &str, body: &Value) -> Vec<(String, Value)> {
    let (status, text) = post(
        addr,
        "/v1/messages",
        body,
        Some(&format!("Authorization: Bearer {KEY}")),
    );
    assert_eq!(status, 200, "{body}: {text}");
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event:") {
            name = Some(n.trim().to_owned());
        } else if let Some(d) = line.strip_prefix("data:") {
            let data = serde_json::from_str(d.trim()).expect("JSON data");
            out.push((name.take().expect("an event name before its data"), data));
        }
    }
    out
}

fn ask(content: &str, extra: Value) -> Value {
    let mut body = json!({"model": "", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": content}]});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

fn weather() -> Value {
    json!({"name": "get_weather", "description": "The current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}})
}

#[test]
fn text_answers_streamed_or_not_and_their_token_count() {
    let (_server, addr) = start();
    let body = ask("What is the capital of France?", json!({}));
    let answer = message(&addr, &body);
    assert_eq!(
        (answer["type"].as_str(), answer["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(
        answer["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_")),
        "{answer}"
    );
    let text = answer["content"][0]["text"]
        .as_str()
        .expect("a text block")
        .to_owned();
    assert_eq!(
        answer["content"].as_array().map(Vec::len),
        Some(1),
        "{answer}"
    );
    assert!(text.contains("Paris"), "{answer}");
    assert!(["end_turn", "max_tokens"].contains(&answer["stop_reason"].as_str().unwrap_or("")));
    let usage = &answer["usage"];
    let prompt = usage["input_tokens"].as_u64().unwrap_or(0)
        + usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert!(
        prompt > 10 && usage["output_tokens"].as_u64() > Some(0),
        "{usage}"
    );

    let streamed = events(
        &addr,
        &ask("What is the capital of France?", json!({"stream": true})),
    );
    let names: Vec<&str> = streamed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names.first().copied().zip(names.get(1).copied()),
        Some(("message_start", "ping")),
        "{names:?}"
    );
    assert_eq!(
        &names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    assert_eq!(names[2], "content_block_start", "{names:?}");
    assert_eq!(streamed[2].1["index"], 0);
    assert_eq!(names[names.len() - 3], "content_block_stop", "{names:?}");
    let joined: String = streamed
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().expect("text deltas only"))
        .collect();
    assert_eq!(joined, text, "the stream says what the answer said");
    let delta = &streamed[names.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], answer["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], usage["output_tokens"]);
    assert_eq!(streamed[0].1["message"]["content"], json!([]));

    // Prompt lookup drafting the stream: the same text.
    let speculated = events(
        &addr,
        &ask(
            "What is the capital of France?",
            json!({"stream": true, "speculative": {"provider": "prompt-lookup", "num_draft_tokens": 4}}),
        ),
    );
    let speculated: String = speculated
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(speculated, text);

    let (status, counted) = post(
        &addr,
        "/v1/messages/count_tokens",
        &json!({"model": "", "messages": body["messages"]}),
        Some(&format!("x-api-key: {KEY}")),
    );
    assert_eq!(status, 200, "{counted}");
    let counted: Value = serde_json::from_str(&counted).expect("JSON");
    assert_eq!(counted, json!({"input_tokens": prompt}));
}

#[test]
fn a_forced_tool_call_follows_its_schema_and_the_result_turn_goes_on() {
    let (_server, addr) = start();
    let forced_body = |extra: Value| {
        let mut body = ask(
            "What is the weather in Paris?",
            json!({"max_tokens": 60, "tools": [weather()],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}}),
        );
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    };
    let forced = |extra: Value| message(&addr, &forced_body(extra));
    let answer = forced(json!({"speculative": false}));
    assert_eq!(answer["stop_reason"], "tool_use", "{answer}");
    let uses: Vec<&Value> = answer["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    let call = uses
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no tool_use in {answer}"));
    assert_eq!(call["name"], "get_weather");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")),
        "{call}"
    );
    let input = call["input"].as_object().expect("an input object");
    assert!(input["city"].is_string(), "{call}");
    assert!(
        ["celsius", "fahrenheit"].contains(&input["unit"].as_str().unwrap_or("")),
        "{call}"
    );
    assert!(input.keys().all(|k| k == "city" || k == "unit"), "{call}");
    for spec in [
        json!({"provider": "prompt-lookup"}),
        json!({"provider": "suffix"}),
    ] {
        let speculated = forced(json!({"speculative": spec}));
        assert_eq!(
            without_ids(&speculated["content"]),
            without_ids(&answer["content"]),
            "{spec}"
        );
    }

    // `any`: a call of some declared tool, its input valid too.
    let any = forced(json!({"tool_choice": {"type": "any", "disable_parallel_tool_use": true}}));
    assert_eq!(any["stop_reason"], "tool_use", "{any}");
    let first = any["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .unwrap_or_else(|| panic!("no tool_use in {any}"));
    assert_eq!(first["name"], "get_weather", "the only tool");
    assert!(first["input"]["city"].is_string(), "{any}");

    // Streamed (with suffix drafting): the call's input arrives as
    // input_json_delta pieces that join into the same input.
    let streamed = events(
        &addr,
        &forced_body(json!({"stream": true, "speculative": {"provider": "suffix"}})),
    );
    let start = streamed
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block in {streamed:?}"));
    assert_eq!(start.1["content_block"]["input"], json!({}));
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let partial: String = streamed
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == start.1["index"])
        .map(|(_, d)| {
            d["delta"]["partial_json"]
                .as_str()
                .expect("input_json_delta")
        })
        .collect();
    let streamed_input: Value = serde_json::from_str(&partial).expect("the pieces join into JSON");
    assert_eq!(&streamed_input, &call["input"]);
    let delta = streamed
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");

    let follow_up = json!({"model": "", "max_tokens": 24, "temperature": 0, "tools": [weather()],
        "tool_choice": {"type": "none"},
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": answer["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                "content": "18 degrees and sunny"}]}]});
    let after = message(&addr, &follow_up);
    assert!(
        ["end_turn", "max_tokens"].contains(&after["stop_reason"].as_str().unwrap_or("")),
        "{after}"
    );
    assert_eq!(after["content"][0]["type"], "text", "{after}");
    let said = after["content"][0]["text"].as_str().unwrap_or("");
    assert!(!said.trim().is_empty(), "{after}");
    // Speculation drafts from the history here (the tool's result): same tokens.
    let mut speculated = follow_up.clone();
    speculated["speculative"] =
        json!({"provider": "prompt-lookup", "num_draft_tokens": 4, "min_ngram": 1});
    assert_eq!(message(&addr, &speculated)["content"], after["content"]);
}

/// `content` without its tool_use ids (fresh per message).
fn without_ids(content: &Value) -> Value {
    let mut content = content.clone();
    for block in content.as_array_mut().into_iter().flatten() {
        if let Some(block) = block.as_object_mut() {
            block.remove("id");
        }
    }
    content
}

#[test]
fn bad_requests_are_400s_in_anthropics_shape_and_keys_come_either_way() {
    let (_server, addr) = start();
    let key = format!("x-api-key: {KEY}");
    let refused = |body: Value, fragment: &str| {
        let (status, text) = post(&addr, "/v1/messages", &body, Some(&key));
        let error: Value = serde_json::from_str(&text).expect("a JSON error");
        assert_eq!(status, 400, "{body}: {text}");
        assert_eq!(error["type"], "error", "{text}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
        let message = error["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(fragment), "{body}: {message}");
    };
    let mut no_max = ask("hi", json!({}));
    no_max.as_object_mut().map(|b| b.remove("max_tokens"));
    refused(no_max, "max_tokens: field required");
    refused(
        ask(
            "hi",
            json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]}),
        ),
        "messages[0].content[0].tool_use_id",
    );
    refused(
        ask(
            "hi",
            json!({"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
        ),
        "unknown or unsupported content block type `hologram`",
    );
    refused(
        ask(
            "hi",
            json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "get_time"}}),
        ),
        "no tool named `get_time`",
    );
    refused(
        ask(
            "hi",
            json!({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}),
        ),
        "tools[0].input_schema",
    );
    refused(
        ask("hi", json!({"speculative": {"provider": "nope"}})),
        "unknown or unloaded draft provider",
    );
    refused(
        ask(
            "hi",
            json!({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"pattern": "("}}}}}}),
        ),
        "",
    );

    // Keys: x-api-key or a bearer token; neither or a wrong one is a 401.
    let small = ask("hi", json!({"max_tokens": 2}));
    for auth in [
        format!("x-api-key: {KEY}"),
        format!("Authorization: Bearer {KEY}"),
    ] {
        assert_eq!(
            post(&addr, "/v1/messages", &small, Some(&auth)).0,
            200,
            "{auth}"
        );
    }
    for auth in [
        None,
        Some("x-api-key: wrong"),
        Some("Authorization: Bearer wrong"),
    ] {
        let (status, text) = post(&addr, "/v1/messages", &small, auth);
        assert_eq!(status, 401, "{auth:?}");
        let error: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(error["error"]["type"], "authentication_error", "{text}");
    }
    let (status, _) = post(
        &addr,
        "/v1/messages/count_tokens",
        &small,
        Some("x-api-key: wrong"),
    );
    assert_eq!(status, 401);
    // Another model, another path under the API: 404s in Anthropic's shape.
    for (path, body) in [
        ("/v1/messages", ask("hi", json!({"model": "claude-opus"}))),
        (
            "/v1/messages/count_tokens",
            ask("hi", json!({"model": "claude-opus"})),
        ),
        ("/v1/messages/batches", small.clone()),
    ] {
        let (status, text) = post(&addr, path, &body, Some(&key));
        assert_eq!(status, 404, "{path}: {text}");
        let error: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(error["error"]["type"], "not_found_error", "{path}: {text}");
    }
    // The OpenAI routes take x-api-key too.
    let (status, _) = post(
        &addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        Some(&key),
    );
    assert_eq!(status, 200);
}

#[test]
fn past_the_request_timeout_errors_keep_anthropics_shape() {
    let (_server, addr) = common::serve(&["--request-timeout", "1"]);
    let long = json!({"model": "", "max_tokens": 4000, "temperature": 0,
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}]});
    // Not streamed: the whole answer runs past the limit, a 504.
    let (status, text) = post(&addr, "/v1/messages", &long, None);
    assert_eq!(status, 504, "{text}");
    let error: Value = serde_json::from_str(&text).expect("a JSON error");
    assert_eq!(
        (error["type"].as_str(), error["error"]["type"].as_str()),
        (Some("error"), Some("timeout_error")),
        "{text}"
    );
    // Streamed: the stream started, so it ends with an `error` event.
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let (status, text) = post(&addr, "/v1/messages", &streamed, None);
    assert_eq!(status, 200, "{text}");
    let last_event = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("event:"))
        .map(str::trim);
    assert_eq!(last_event, Some("error"), "{text}");
    assert!(!text.contains("message_stop"), "{text}");
    assert!(text.contains("timeout_error"), "{text}");
}

/// SmolLM2's own ChatML template, made a thinking one: the generation
/// prompt opens `<think>` unless `enable_thinking` is false, which closes
/// it empty (as Qwen3's does).
const THINKING_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}";

/// The default model converted to a directory whose template thinks.
fn thinking_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_str().expect("a UTF-8 path");
    let (ok, _, stderr) = common::mlx_spec(&["convert", "--out", out]);
    assert!(ok, "convert: {stderr}");
    let path = dir.path().join("tokenizer_config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    config["chat_template"] = json!(THINKING_TEMPLATE);
    std::fs::write(&path, config.to_string()).expect("write");
    dir
}

#[test]
fn a_thinking_template_answers_in_thinking_blocks_and_disabled_thinking_in_text() {
    let model = thinking_model();
    let path = model.path().to_str().expect("a UTF-8 path");
    let (_server, addr) = common::serve(&["--model", path, "--draft-provider", "prompt-lookup"]);
    let body = |extra: Value| {
        let mut body = json!({"model": "", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Is 17 a prime number?"}]});
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    };
    let (status, text) = post(&addr, "/v1/messages", &body(json!({})), None);
    assert_eq!(status, 200, "{text}");
    let thought: Value = serde_json::from_str(&text).expect("JSON");
    let first = &thought["content"][0];
    assert_eq!(first["type"], "thinking", "{thought}");
    assert_eq!(first["signature"], "");
    let thinking = first["thinking"].as_str().unwrap_or("");
    assert!(!thinking.trim().is_empty(), "{thought}");
    assert!(
        !thinking.contains("<think>") && !text.contains("</think>"),
        "{thought}"
    );
    for block in thought["content"].as_array().into_iter().flatten().skip(1) {
        assert_eq!(block["type"], "text", "{thought}");
    }

    // Streamed with speculation: thinking_delta events, the same blocks.
    let streamed = events(
        &addr,
        &body(json!({"stream": true, "speculative": {"provider": "prompt-lookup"}})),
    );
    let start = streamed
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .expect("a block");
    assert_eq!(start.1["content_block"]["type"], "thinking");
    let joined: String = streamed
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == 0)
        .map(|(_, d)| d["delta"]["thinking"].as_str().expect("thinking_delta"))
        .collect();
    assert_eq!(joined, thinking);

    // Disabled: the prompt closes the reasoning; the answer is text.
    let (status, text) = post(
        &addr,
        "/v1/messages",
        &body(json!({"thinking": {"type": "disabled"}})),
        None,
    );
    assert_eq!(status, 200, "{text}");
    let plain: Value = serde_json::from_str(&text).expect("JSON");
    let kinds: Vec<&str> = plain["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert_eq!(kinds, ["text"], "{plain}");
    // The thinking prompt is longer by the open marker only; disabled adds
    // the closed pair: count_tokens sees the template's kwarg.
    let count = |extra: Value| {
        let mut request = body(extra);
        request.as_object_mut().map(|b| b.remove("max_tokens"));
        let (status, text) = post(&addr, "/v1/messages/count_tokens", &request, None);
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).expect("JSON")["input_tokens"].as_u64()
    };
    assert!(
        count(json!({"thinking": {"type": "disabled"}}))
            > count(json!({"thinking": {"type": "adaptive"}})),
        "enable_thinking reaches the template"
    );
}
