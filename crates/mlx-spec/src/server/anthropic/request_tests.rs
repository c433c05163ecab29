//! Translation and validation of Messages requests.

use super::*;
use axum::http::StatusCode;
use spec_agent::{Tool, ToolChoice};

fn request(body: Value) -> MessagesRequest {
    serde_json::from_value(body).expect("an object")
}

fn base(extra: Value) -> Value {
    let mut body = json!({"model": "m", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

fn ok(extra: Value) -> (ChatTurn, Common) {
    translate(&request(base(extra.clone())), Route::Messages)
        .unwrap_or_else(|e| panic!("{extra}: {}", e.message))
}

/// `extra` over a good request is a 400 naming `param`, its message
/// holding `fragment`.
fn check_refused(extra: Value, param: &str, fragment: &str) {
    let err =
        translate(&request(base(extra.clone())), Route::Messages).expect_err("must be refused");
    assert_eq!(
        (err.status, err.param),
        (StatusCode::BAD_REQUEST, Some(param)),
        "{extra}: {}",
        err.message
    );
    assert!(err.message.contains(fragment), "{extra}: {}", err.message);
}

fn weather() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}})
}

#[test]
fn generation_fields_become_the_openai_ones() {
    let (turn, common) = ok(json!({"temperature": 0, "top_p": 0.5, "top_k": 3,
        "stop_sequences": ["END"], "stream": true, "metadata": {"user_id": "u1"},
        "speculative": {"provider": "suffix"}, "cache_salt": "s",
        "system": "Be brief."}));
    assert_eq!(common.model.as_deref(), Some("m"));
    assert_eq!(common.max_tokens, Some(64));
    assert_eq!(
        (common.temperature, common.top_p, common.top_k),
        (Some(0.0), Some(0.5), Some(3))
    );
    assert!(common.stream);
    assert!(matches!(&common.stop, Some(crate::server::api::Stop::Many(s)) if s == &["END"]));
    assert!(
        matches!(&common.speculative, Some(crate::server::api::SpecField::On(s)) if s.provider == "suffix")
    );
    assert_eq!(common.cache_salt.as_deref(), Some("s"));
    assert_eq!(common.response_format, None);
    assert_eq!(turn.messages.len(), 2, "the system text leads");
    assert!(
        turn.template_kwargs.is_empty(),
        "no thinking field: the template's default"
    );
    assert!(turn.tools.is_empty());
    let (_, off) = ok(json!({"speculative": false}));
    assert!(matches!(
        off.speculative,
        Some(crate::server::api::SpecField::Off(false))
    ));
}

#[test]
fn tools_and_tool_choice_translate() {
    let (turn, _) = ok(json!({"tools": [weather()],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}}));
    assert_eq!(turn.tools.len(), 1);
    assert_eq!(turn.tools[0].name, "get_weather");
    assert_eq!(
        turn.tools[0].description.as_deref(),
        Some("The weather in a city")
    );
    assert_eq!(turn.tools[0].parameters["required"], json!(["city"]));
    assert!(matches!(&turn.tool_choice, ToolChoice::Named(n) if n == "get_weather"));
    assert!(!turn.parallel_tool_calls);
    for (choice, expected) in [
        (json!({"type": "auto"}), ToolChoice::Auto),
        (json!({"type": "any"}), ToolChoice::Required),
        (json!({"type": "none"}), ToolChoice::None),
        (Value::Null, ToolChoice::Auto),
    ] {
        let (turn, _) = ok(json!({"tools": [weather()], "tool_choice": choice}));
        assert_eq!(
            format!("{:?}", turn.tool_choice),
            format!("{expected:?}"),
            "{choice}"
        );
        assert!(turn.parallel_tool_calls, "{choice}");
    }
}

#[test]
fn thinking_sets_enable_thinking_and_output_config_a_schema() {
    for (thinking, enable) in [
        (json!({"type": "enabled", "budget_tokens": 32}), true),
        (json!({"type": "adaptive"}), true),
        (json!({"type": "disabled"}), false),
    ] {
        let (turn, _) = ok(json!({"thinking": thinking}));
        assert_eq!(
            turn.template_kwargs.get("enable_thinking"),
            Some(&json!(enable)),
            "{thinking}"
        );
    }
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let (_, common) = ok(
        json!({"output_config": {"format": {"type": "json_schema", "schema": schema},
        "effort": "low"}}),
    );
    let format = common.response_format.expect("a response_format");
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["schema"], schema);
    // The server's own parser takes what the translation wrote.
    let parsed =
        crate::server::response_format::ResponseFormat::parse(Some(&format)).expect("valid");
    assert!(parsed.grammar().is_some());
}

#[test]
fn count_tokens_needs_no_max_tokens() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (turn, common) = translate(&request(body.clone()), Route::CountTokens).expect("valid");
    assert_eq!((turn.messages.len(), common.max_tokens), (1, None));
    let err = translate(&request(body), Route::Messages).expect_err("max_tokens missing");
    assert_eq!(err.param, Some("max_tokens"));
    assert!(
        err.message.contains("max_tokens: field required"),
        "{}",
        err.message
    );
}

#[test]
fn bad_fields_are_400s_naming_the_field() {
    let mut no_model = base(json!({}));
    no_model.as_object_mut().map(|b| b.remove("model"));
    let err = translate(&request(no_model), Route::Messages).expect_err("no model");
    assert_eq!(err.param, Some("model"));
    for (extra, param, fragment) in [
        (json!({"max_tokens": 0}), "max_tokens", "at least 1"),
        (json!({"max_tokens": "many"}), "max_tokens", "an integer"),
        (json!({"temperature": 1.5}), "temperature", "from 0 to 1"),
        (json!({"top_k": -1}), "top_k", "non-negative"),
        (json!({"stream": "yes"}), "stream", "boolean"),
        (json!({"metadata": {"user_id": 5}}), "metadata", "user_id"),
        (
            json!({"stop_sequences": ["a", ""]}),
            "stop_sequences",
            "non-empty",
        ),
        (
            json!({"stop_sequences": ["a", "b", "c", "d", "e"]}),
            "stop_sequences",
            "at most 4",
        ),
        (
            json!({"tools": [weather(), weather()]}),
            "tools",
            "tools[1].name \"get_weather\": another tool already has this name",
        ),
        (
            json!({"tools": [{"name": "f"}]}),
            "tools",
            "tools[0].input_schema: field required",
        ),
        (
            json!({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}),
            "tools",
            "tools[0].input_schema: must have `type: \"object\"`",
        ),
        (
            json!({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": 3}}}]}),
            "tools",
            "tools[0].input_schema.properties.a",
        ),
        (
            json!({"tools": [{"name": "f", "input_schema": {"type": "object", "required": "a"}}]}),
            "tools",
            "tools[0] (f).input_schema: `required` must be an array",
        ),
        (
            json!({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}),
            "tools",
            "tools[0].name \"bad name\": a tool name is 1 to 64",
        ),
        (
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools",
            "tools[0].type",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "get_time"}}),
            "tool_choice",
            "tool_choice.name: no tool named `get_time` in `tools` (get_weather)",
        ),
        (
            json!({"tool_choice": {"type": "any"}}),
            "tool_choice",
            "`any` needs `tools`",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "required"}}),
            "tool_choice",
            "unknown type `required`",
        ),
        (
            json!({"tools": [weather()], "tool_choice": "auto"}),
            "tool_choice",
            "must be an object",
        ),
        (
            json!({"thinking": {"type": "enabled"}}),
            "thinking",
            "thinking.budget_tokens: field required",
        ),
        (
            json!({"thinking": {"type": "enabled", "budget_tokens": 64}}),
            "thinking",
            "less than max_tokens (64)",
        ),
        (
            json!({"thinking": {"type": "sometimes"}}),
            "thinking",
            "unknown type `sometimes`",
        ),
        (
            json!({"output_config": {"format": {"type": "json_schema"}}}),
            "output_config",
            "output_config.format.schema: field required",
        ),
        (
            json!({"output_config": {"format": {"type": "yaml", "schema": {}}}}),
            "output_config",
            "unknown type `yaml`",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]}),
            "messages",
            "messages[0].content[0].tool_use_id",
        ),
        (json!({"messages": "hi"}), "messages", "must be a list"),
        (
            json!({"speculative": {"num_draft_tokens": 3}}),
            "speculative",
            "provider",
        ),
        (json!({"cache_salt": 5}), "cache_salt", "a string"),
    ] {
        check_refused(extra, param, fragment);
    }
}

/// A whole Anthropic conversation, translated, renders through a real
/// family template (Qwen3's, spec-agent's fixture: its README says where
/// it came from) as that family's own history: the system text, the call
/// in its `<tool_call>` layout, the result in `<tool_response>`, the tools
/// described, and `thinking: disabled` closing the reasoning.
#[test]
fn a_translated_tool_round_trip_renders_through_qwen3s_template() {
    let source = include_str!("../../../../spec-agent/tests/templates/qwen3.jinja");
    let template =
        spec_text::ChatTemplate::new(source, None, Some("<|im_end|>")).expect("compiles");
    let (turn, _) = ok(json!({"system": "Be brief.", "tools": [weather()],
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}]}));
    let tools: Vec<Value> = turn.tools.iter().map(Tool::openai_json).collect();
    let text = template
        .render_with(
            &turn.messages,
            &spec_text::RenderOptions {
                add_generation_prompt: true,
                tools: Some(&tools),
                kwargs: Some(&turn.template_kwargs),
            },
        )
        .expect("renders");
    for expected in [
        "<|im_start|>system\nBe brief.",
        "\"name\": \"get_weather\"",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_response>\n18 C\n</tool_response>",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from\n{text}");
    }
    assert!(
        text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "enable_thinking false closes the reasoning:\n{text}"
    );
}
