//! `mlx-spec serve` over loopback on SmolLM2 (whose ChatML template knows
//! no tools: the server describes them in a system message and constrains
//! calls to the Hermes syntax): `tools` with `tool_choice` required or
//! named give calls whose arguments validate against their schemas, with
//! `finish_reason: "tool_calls"`, the same streamed as whole and with
//! speculation (prompt lookup, suffix) as without; a follow-up turn with
//! the calls and their results answers; bad tool fields are 400s naming
//! the field before anything reaches the engine.

use std::io::Read;

use serde_json::{json, Value};

mod common;

use common::{http_post, http_send, metric};

fn start() -> (common::Served, String) {
    common::serve(&[
        "--max-batch",
        "4",
        "--draft-provider",
        "prompt-lookup",
        "--draft-provider",
        "suffix",
    ])
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": false}}},
    ])
}

/// Whether `args` is valid under one of [`tools`]' flat object schemas:
/// the required keys present, no others, each of its declared type and
/// enum.
fn valid(name: &str, args: &Value) -> bool {
    let tools = tools();
    let Some(schema) = tools
        .as_array()
        .expect("list")
        .iter()
        .find(|t| t["function"]["name"] == name)
        .map(|t| t["function"]["parameters"].clone())
    else {
        return false;
    };
    let Some(args) = args.as_object() else {
        return false;
    };
    let properties = schema["properties"].as_object().expect("properties");
    let required_present = schema["required"]
        .as_array()
        .expect("required")
        .iter()
        .all(|k| args.contains_key(k.as_str().expect("key")));
    required_present
        && args.iter().all(|(key, value)| {
            let Some(property) = properties.get(key) else {
                return false;
            };
            let typed = match property["type"].as_str() {
                Some("string") => value.as_str().is_some_and(|s| {
                    property["maxLength"]
                        .as_u64()
                        .is_none_or(|max| s.chars().count() as u64 <= max)
                }),
                Some("integer") => value.is_i64() || value.is_u64(),
                other => panic!("no check for {other:?}"),
            };
            let listed = property["enum"]
                .as_array()
                .is_none_or(|options| options.contains(value));
            typed && listed
        })
}

fn question() -> Value {
    json!([{"role": "user", "content": "What is the weather in Paris, in celsius?"}])
}

fn body(messages: Value, extra: Value) -> Value {
    let mut body =
        json!({"messages": messages, "tools": tools(), "max_tokens": 64, "temperature": 0});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

/// The whole answer.
fn answer(addr: &str, body: &Value) -> Value {
    let (status, answer) = http_post(addr, "/v1/chat/completions", body);
    assert_eq!(status, 200, "{body}: {answer}");
    answer
}

/// The whole answer's choice.
fn choice(addr: &str, body: &Value) -> Value {
    answer(addr, body)["choices"][0].clone()
}

/// `(name, arguments as sent)` of each call, checking each call's shape.
fn calls(message: &Value) -> Vec<(String, String)> {
    message["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls in {message}"))
        .iter()
        .map(|call| {
            let id = call["id"].as_str().expect("id");
            assert!(id.starts_with("call_"), "{call}");
            assert_eq!(call["type"], "function", "{call}");
            let name = call["function"]["name"].as_str().expect("name").to_owned();
            let arguments = call["function"]["arguments"]
                .as_str()
                .expect("arguments are a JSON string")
                .to_owned();
            let parsed: Value = serde_json::from_str(&arguments).expect("arguments parse");
            assert!(valid(&name, &parsed), "{name}({arguments}) is not valid");
            (name, arguments)
        })
        .collect()
}

/// The streamed chunks of `body` (with `stream: true`).
fn stream(addr: &str, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut raw = String::new();
    http_send(addr, "POST", "/v1/chat/completions", &body.to_string())
        .read_to_string(&mut raw)
        .expect("read the stream");
    assert!(raw.contains("data: [DONE]"), "{raw}");
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str(d).expect("a chunk"))
        .collect()
}

/// A stream's deltas merged as OpenAI's clients merge them: content, calls
/// (`(name, arguments)`), finish reason.
fn merged(chunks: &[Value]) -> (String, Vec<(String, String)>, String) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = String::new();
    for chunk in chunks {
        let choice = &chunk["choices"][0];
        content += choice["delta"]["content"].as_str().unwrap_or("");
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_owned();
        }
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = call["index"].as_u64().expect("index") as usize;
            let arguments = call["function"]["arguments"].as_str().expect("arguments");
            if index == calls.len() {
                assert!(
                    call["id"].as_str().expect("id").starts_with("call_"),
                    "{call}"
                );
                assert_eq!(call["type"], "function", "{call}");
                assert_eq!(arguments, "", "a call's first chunk: {call}");
                let name = call["function"]["name"].as_str().expect("name");
                calls.push((name.to_owned(), String::new()));
            } else {
                assert!(call.get("id").is_none(), "{call}");
                calls[index].1 += arguments;
            }
        }
    }
    (content, calls, finish)
}

#[test]
fn forced_calls_validate_stream_alike_and_speculation_changes_nothing() {
    let (_server, addr) = start();
    // A named function is called once, `parallel_tool_calls` or not.
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let whole = answer(
        &addr,
        &body(
            question(),
            json!({"tool_choice": named, "speculative": false}),
        ),
    );
    let plain = whole["choices"][0].clone();
    assert_eq!(plain["finish_reason"], "tool_calls", "{plain}");
    let plain_calls = calls(&plain["message"]);
    assert_eq!(plain_calls.len(), 1, "{plain}");
    assert_eq!(plain_calls[0].0, "get_weather", "{plain}");
    for provider in ["prompt-lookup", "suffix"] {
        let answer = answer(
            &addr,
            &body(
                question(),
                json!({"tool_choice": named, "speculative": {"provider": provider}}),
            ),
        );
        assert_eq!(answer["speculative"]["provider"], provider, "{answer}");
        for count in ["prompt_tokens", "completion_tokens"] {
            assert_eq!(answer["usage"][count], whole["usage"][count], "{provider}");
        }
        let speculated = &answer["choices"][0];
        assert_eq!(calls(&speculated["message"]), plain_calls, "{provider}");
        assert_eq!(
            speculated["message"]["content"], plain["message"]["content"],
            "{provider}"
        );
    }
    // Streamed: the same calls, as deltas.
    let chunks = stream(
        &addr,
        &body(
            question(),
            json!({"tool_choice": named, "speculative": false}),
        ),
    );
    let (content, streamed_calls, finish) = merged(&chunks);
    assert_eq!(streamed_calls, plain_calls);
    assert_eq!(
        content,
        plain["message"]["content"].as_str().unwrap_or(""),
        "{chunks:?}"
    );
    assert_eq!(finish, "tool_calls");

    // `required`, one call: a tool of the list, valid arguments; with
    // log-probabilities.
    let required = choice(
        &addr,
        &body(
            json!([{"role": "user", "content": "Add 2 and 3."}]),
            json!({"tool_choice": "required", "parallel_tool_calls": false, "logprobs": true,
                "speculative": {"provider": "suffix"}}),
        ),
    );
    assert_eq!(required["finish_reason"], "tool_calls", "{required}");
    assert_eq!(calls(&required["message"]).len(), 1, "{required}");
    assert!(
        !required["logprobs"]["content"]
            .as_array()
            .expect("logprobs")
            .is_empty(),
        "{required}"
    );

    // The follow-up: the call and its result in the history; the model
    // answers in text (`tool_choice: none`), the same with speculation.
    let call = &plain["message"]["tool_calls"][0];
    let history = json!([
        question()[0],
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 18, \"sky\": \"clear\"}"},
    ]);
    let answers: Vec<Value> = [json!(false), json!({"provider": "prompt-lookup"})]
        .into_iter()
        .map(|speculative| {
            choice(
                &addr,
                &body(
                    history.clone(),
                    json!({"tool_choice": "none", "speculative": speculative}),
                ),
            )
        })
        .collect();
    let text = answers[0]["message"]["content"].as_str().expect("text");
    assert!(!text.trim().is_empty(), "{}", answers[0]);
    assert!(answers[0]["message"].get("tool_calls").is_none());
    assert!(["stop", "length"].contains(&answers[0]["finish_reason"].as_str().expect("finish")));
    assert_eq!(answers[1]["message"], answers[0]["message"]);
}

#[test]
fn bad_tool_fields_are_400s_before_the_engine() {
    let (_server, addr) = start();
    let weather_call = json!({"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": "}}]});
    let cases = [
        (
            json!({"tools": {"type": "function"}}),
            "tools",
            "must be a list",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                "properties": {"x": {"type": "no-such-type"}}}}}], "tool_choice": "required"}),
            "tools",
            "tools[0].function.parameters",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
            "tool_choice",
            "`get_time`",
        ),
        (
            json!({"messages": [question()[0], weather_call]}),
            "messages",
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": [question()[0], {"role": "tool", "content": "18"}]}),
            "messages",
            "messages[1].tool_call_id",
        ),
    ];
    for (extra, param, names) in cases {
        let (status, answer) = http_post(
            &addr,
            "/v1/chat/completions",
            &body(question(), extra.clone()),
        );
        assert_eq!(status, 400, "{extra}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains(names), "{extra}: {message}");
    }
    assert_eq!(metric(&addr, "mlx_spec_requests_total"), 0.0);
    // `auto` leaves the model free: whatever it writes comes back (calls
    // parsed, anything else as content), never a 500.
    let auto = choice(&addr, &body(question(), json!({"tool_choice": "auto"})));
    assert!(
        auto["message"]["content"].is_string() || auto["message"]["tool_calls"].is_array(),
        "{auto}"
    );
    // The legacy endpoint is unchanged.
    let (status, completion) = http_post(
        &addr,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(status, 200, "{completion}");
    assert!(completion["choices"][0]["text"].is_string());
}

/// A thinking model's template (its generation prompt opens `<think>`;
/// `enable_thinking: false` closes it at once), on a tiny llama.
const THINKING: &str = "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: <think>\n{% if enable_thinking is defined and not enable_thinking %}</think>\n{% endif %}{% endif %}";

/// On a tiny llama whose tokens are bytes (so the grammar engine reads its
/// vocabulary), with prompt lookup loaded.
#[test]
fn reasoning_comes_back_apart_and_the_format_applies_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), THINKING);
    common::write_byte_tokenizer(dir.path());
    // Constrained decoding needs an end token: a rare byte.
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"chat_template": THINKING, "eos_token": "`"}).to_string(),
    )
    .expect("tokenizer_config.json");
    let model = dir.path().to_string_lossy().into_owned();
    let (_server, addr) = common::serve(&["--model", &model, "--draft-provider", "prompt-lookup"]);
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Pick a number."}],
            "max_tokens": 12, "temperature": 0, "speculative": false,
            "response_format": {"type": "regex", "regex": "[0-9]{3}"}});
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    };
    // The prompt ends inside `<think>` and the tiny model does not close
    // it: everything it writes is reasoning, free of the regex, which
    // would apply once the reasoning ended.
    let thinking = choice(&addr, &ask(json!({})));
    let reasoning = thinking["message"]["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("no reasoning_content in {thinking}"));
    assert!(
        reasoning.bytes().any(|b| !b.is_ascii_digit()),
        "the regex held inside the reasoning: {thinking}"
    );
    assert_eq!(thinking["message"]["content"], "", "{thinking}");
    let chunks = stream(&addr, &ask(json!({})));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(streamed, reasoning);
    assert_eq!(merged(&chunks).0, "", "no content streamed");
    let speculated = choice(
        &addr,
        &ask(json!({"speculative": {"provider": "prompt-lookup", "min_ngram": 1}})),
    );
    assert_eq!(speculated["message"], thinking["message"]);
    // `enable_thinking: false` reaches the template, which closes the
    // block: the answer follows the regex from its first token.
    let quiet = choice(
        &addr,
        &ask(json!({"chat_template_kwargs": {"enable_thinking": false}})),
    );
    assert!(
        quiet["message"].get("reasoning_content").is_none(),
        "{quiet}"
    );
    let answer = quiet["message"]["content"].as_str().expect("content");
    assert!(
        answer.len() == 3 && answer.bytes().all(|b| b.is_ascii_digit()),
        "{quiet}"
    );
    assert_eq!(quiet["finish_reason"], "stop", "{quiet}");
}

/// A call the model opens but never writes well (a tiny llama forced by
/// `logit_bias` to write `<tool_call>`, a vocabulary without constrained
/// decoding, so `auto` leaves it free): its text comes back as content,
/// never a 500.
#[test]
fn a_malformed_call_under_auto_is_content() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(
        dir.path(),
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:",
    );
    // The last word of the vocabulary becomes the Hermes call marker.
    let path = dir.path().join("tokenizer.json");
    let tokenizer = std::fs::read_to_string(&path).expect("tokenizer.json");
    std::fs::write(&path, tokenizer.replace("\"w95\"", "\"<tool_call>\"")).expect("rewrite");
    let model = dir.path().to_string_lossy().into_owned();
    let (_server, addr) = common::serve(&["--model", &model]);
    let body = json!({"messages": [{"role": "user", "content": "w1 w2"}], "tools": tools(),
        "tool_choice": "auto", "max_tokens": 4, "temperature": 0, "logit_bias": {"95": 100}});
    let answer = choice(&addr, &body);
    let content = answer["message"]["content"].as_str().expect("content");
    assert!(content.starts_with("<tool_call>"), "{answer}");
    assert!(answer["message"].get("tool_calls").is_none(), "{answer}");
    assert_eq!(answer["finish_reason"], "length", "{answer}");
    let (streamed, calls, _) = merged(&stream(&addr, &body));
    assert_eq!((streamed.as_str(), calls.len()), (content, 0));
}

/// gpt-oss's chat template (spec-agent's fixture) on SmolLM2: a named
/// call is written as a harmony message and comes back as `tool_calls`,
/// whole and streamed, its arguments under the schema; the next turn
/// renders the call and its result as harmony messages and answers.
#[test]
fn harmony_calls_come_back_as_tool_calls() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../spec-agent/tests/templates/gpt-oss.jinja"
    );
    let (_server, addr) = common::serve(&["--chat-template", template]);
    // The grammar lets analysis and commentary messages come first, where
    // the tiny model would ramble to the token limit; with `<` (SmolLM2's
    // token 44) biased away it writes the call at once (the grammar still
    // takes `<` where nothing else may come).
    let ask = body(
        question(),
        json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "logit_bias": {"44": -100}}),
    );
    let whole = answer(&addr, &ask);
    let first = &whole["choices"][0];
    assert_eq!(first["finish_reason"], "tool_calls", "{whole}");
    let made = calls(&first["message"]);
    assert_eq!(made.len(), 1, "{first}");
    assert_eq!(made[0].0, "get_weather", "{first}");
    assert!(first["message"]["content"].is_null(), "{first}");
    let (content, streamed, finish) = merged(&stream(&addr, &ask));
    assert_eq!(
        (content.as_str(), streamed, finish.as_str()),
        ("", made, "tool_calls")
    );

    let call = &first["message"]["tool_calls"][0];
    let history = json!([
        question()[0],
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 18}"},
    ]);
    let next = answer(
        &addr,
        &body(history, json!({"tool_choice": "none", "max_tokens": 8})),
    );
    let prompt = next["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt tokens");
    let before = whole["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt tokens");
    assert!(
        prompt > before,
        "the call and its result are in the prompt: {next}"
    );
    assert!(
        next["choices"][0]["message"].get("tool_calls").is_none(),
        "{next}"
    );
}
