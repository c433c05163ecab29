use serde_json::{json, Value};
use spec_agent::ToolChoice;

use super::{check, ResponsesRequest};

fn request(body: Value) -> ResponsesRequest {
    serde_json::from_value(body).expect("a request")
}

#[test]
fn fields_translate_and_echo() {
    let req = request(json!({
        "model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 32,
        "temperature": 0, "top_p": 0.5, "store": false, "stream": true,
        "tools": [{"type": "function", "name": "f", "description": "d",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}],
        "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
        "text": {"format": {"type": "json_schema", "name": "out", "strict": true,
            "schema": {"type": "object"}}},
        "reasoning": {"effort": "none"}, "include": ["message.output_text.logprobs"],
        "top_logprobs": 3, "metadata": {"k": "v"}, "speculative": false, "seed": 7,
    }));
    let c = check(&req).expect("checked");
    assert_eq!(c.common.max_tokens, Some(32));
    assert_eq!(c.common.temperature, Some(0.0));
    assert!(c.common.stream);
    assert_eq!(c.common.seed, Some(7));
    assert_eq!(
        c.common.response_format,
        Some(json!({"type": "json_schema",
            "json_schema": {"name": "out", "strict": true, "schema": {"type": "object"}}}))
    );
    assert_eq!(c.instructions.as_deref(), Some("be brief"));
    assert!(!c.store);
    assert_eq!(c.tools.len(), 1);
    assert_eq!(c.tool_choice, ToolChoice::Named("f".into()));
    assert!(!c.parallel_tool_calls);
    assert_eq!(
        c.template_kwargs.get("enable_thinking"),
        Some(&json!(false))
    );
    assert_eq!(c.logprobs, Some(3));
    assert_eq!(
        c.echo["tool_choice"],
        json!({"type": "function", "name": "f"})
    );
    assert_eq!(c.echo["tools"][0]["name"], json!("f"));
    assert_eq!(c.echo["metadata"], json!({"k": "v"}));
    assert_eq!(c.echo["text"]["format"]["name"], json!("out"));
    assert_eq!(
        c.echo["reasoning"],
        json!({"effort": "none", "summary": null})
    );
    // Defaults: stored, text, no log-probabilities, thinking as the
    // template has it.
    let c = check(&request(
        json!({"input": "hi", "reasoning": {"effort": "high"}}),
    ))
    .expect("checked");
    assert!(c.store && c.logprobs.is_none() && c.common.max_tokens.is_none());
    assert_eq!(c.echo["text"], json!({"format": {"type": "text"}}));
    assert_eq!(
        c.template_kwargs.get("reasoning_effort"),
        Some(&json!("high"))
    );
}

#[test]
fn bad_fields_are_400s_naming_the_field() {
    let cases = [
        (json!({"model": 3}), "model"),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"top_p": -1}), "top_p"),
        (json!({"store": "yes"}), "store"),
        (json!({"include": ["everything"]}), "include"),
        (json!({"top_logprobs": 21}), "top_logprobs"),
        (json!({"tools": [{"type": "web_search"}]}), "tools"),
        (json!({"tools": [{"type": "function", "name": 5}]}), "tools"),
        (
            json!({"tool_choice": {"type": "function", "name": "nope"},
            "tools": [{"type": "function", "name": "f"}]}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"text": {"format": {"type": "xml"}}}), "text"),
        (json!({"reasoning": {"effort": "max"}}), "reasoning"),
        (json!({"metadata": {"k": 1}}), "metadata"),
        (json!({"truncation": "smart"}), "truncation"),
        (json!({"background": true}), "background"),
        (json!({"conversation": "conv_1"}), "conversation"),
        (json!({"max_tool_calls": 2}), "max_tool_calls"),
        (json!({"previous_response_id": 1}), "previous_response_id"),
    ];
    for (body, param) in cases {
        let e = check(&request(body.clone())).expect_err(&body.to_string());
        assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    }
    // The tool paths are the Responses API's.
    let e = check(&request(
        json!({"tools": [{"type": "function", "name": 5}]}),
    ))
    .expect_err("bad");
    assert!(e.message.contains("`tools[0].name`"), "{}", e.message);
    let e = check(&request(json!({"tools": [{"type": "web_search"}]}))).expect_err("bad");
    assert!(
        e.message
            .contains("`web_search` tools run on OpenAI's servers"),
        "{}",
        e.message
    );
}
