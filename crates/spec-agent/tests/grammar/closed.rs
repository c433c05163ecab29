//! Calls are closed to their declared properties, single under a named
//! choice, and laid out as the templates write JSON.

use super::*;

/// Regression (the agent loop on SmolLM2): an open schema let the model add
/// properties until max_tokens, and a named choice with parallel calls let
/// it open a second call.
#[test]
fn calls_are_closed_single_when_named_and_laid_out_as_templates_write() {
    let tools = [weather(), add()];
    let call = |args: &str| {
        format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>")
    };
    let named = grammar(
        None,
        ToolFormat::Hermes,
        &tools,
        &ToolChoice::Named("get_weather".into()),
        true,
    );
    assert_eq!(run(&named, &call(r#"{"city": "Paris"}"#)), (true, true));
    assert!(
        !run(&named, &call(r#"{"city": "Paris", "reason": "asked"}"#)).0,
        "an undeclared property"
    );
    let twice = format!(
        "{}\n{}",
        call(r#"{"city": "Paris"}"#),
        call(r#"{"city": "Rome"}"#)
    );
    assert!(!run(&named, &twice).0, "a named choice is one call");
    let required = grammar(
        None,
        ToolFormat::Hermes,
        &tools,
        &ToolChoice::Required,
        true,
    );
    assert_eq!(
        run(&required, &twice),
        (true, true),
        "required and parallel: several"
    );
    // The fallback's own writer lays calls out as the grammar wants them.
    let fallback = output_grammar(
        None,
        None,
        &tools,
        &ToolChoice::Required,
        false,
        None,
        &special,
    )
    .expect("grammar")
    .expect("a constraint");
    let written = spec_agent::fallback_call_text("get_weather", &arguments());
    assert_eq!(run(&fallback, &written), (true, true), "{written}");
    assert!(
        !run(&required, &call(r#"{"city":"Paris"}"#)).0,
        "json.dumps separators"
    );
    assert!(
        !run(&required, &call("{\n  \"city\": \"Paris\"\n}")).0,
        "no indentation"
    );
    // A schema that allows more says so.
    let open = Tool {
        name: "note".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": true}),
    };
    let spec = grammar(
        None,
        ToolFormat::Hermes,
        &[open],
        &ToolChoice::Required,
        false,
    );
    let extra = "<tool_call>\n{\"name\": \"note\", \"arguments\": {\"text\": \"a\", \"tag\": 1}}\n</tool_call>";
    assert_eq!(run(&spec, extra), (true, true));
}

/// GLM-4.7's and GLM-5's templates write a call's parts together
/// (`'<tool_call>' + tc.name` then `<arg_key>..</arg_key><arg_value>..</arg_value>`
/// with no newlines), GLM-4.5's and 4.6's on lines of their own: both pass.
#[test]
fn glm_calls_with_or_without_newlines() {
    let spec = grammar(
        None,
        ToolFormat::Glm45,
        &[weather()],
        &ToolChoice::Required,
        false,
    );
    let compact = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";
    assert_eq!(run(&spec, compact), (true, true), "{spec:?}");
    let lines = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>";
    assert_eq!(run(&spec, lines), (true, true));
    assert!(!run(&spec, &compact.replace(">3<", ">three<")).0);
}
