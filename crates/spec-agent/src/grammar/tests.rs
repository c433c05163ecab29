//! Grammar text checks that need no vocabulary; the grammars are run
//! against a real tokenizer in `tests/grammar.rs`.

use serde_json::json;

use super::*;

fn no_special(_: &str) -> Option<u32> {
    None
}

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }
}

#[test]
fn nothing_to_constrain_is_none() {
    let tools = [weather()];
    for choice in [ToolChoice::None, ToolChoice::Auto] {
        assert_eq!(
            output_grammar(None, None, &[], &choice, true, None, &no_special),
            Ok(None)
        );
    }
    assert_eq!(
        output_grammar(
            None,
            None,
            &tools,
            &ToolChoice::None,
            true,
            None,
            &no_special
        ),
        Ok(None)
    );
    let schema = GrammarSpec::JsonSchema(json!({"type": "object"}));
    assert_eq!(
        output_grammar(
            None,
            None,
            &tools,
            &ToolChoice::None,
            true,
            Some(&schema),
            &no_special
        ),
        Ok(Some(schema.clone())),
        "a response format alone passes through"
    );
}

#[test]
fn bad_choices_name_the_problem() {
    let tools = [weather()];
    let err = output_grammar(
        None,
        None,
        &tools,
        &ToolChoice::Named("nope".into()),
        true,
        None,
        &no_special,
    )
    .expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "tool_choice names the function \"nope\", which is not among the tools (get_weather)"
    );
    let err = output_grammar(
        None,
        None,
        &[],
        &ToolChoice::Required,
        true,
        None,
        &no_special,
    )
    .expect_err("no tools");
    assert_eq!(err, AgentError::NoTools { choice: "required" });
    let lark = GrammarSpec::Lark("start: \"x\"".into());
    let err = output_grammar(
        None,
        None,
        &tools,
        &ToolChoice::Auto,
        true,
        Some(&lark),
        &no_special,
    )
    .expect_err("lark with tools");
    assert!(
        err.to_string()
            .contains("Lark grammar cannot be combined with tools"),
        "{err}"
    );
}

#[test]
fn special_markers_are_named_by_id() {
    let special = |t: &str| (t == "[TOOL_CALLS]").then_some(5);
    let Some(GrammarSpec::Lark(text)) = output_grammar(
        None,
        Some(ToolFormat::Mistral),
        &[weather()],
        &ToolChoice::Required,
        false,
        None,
        &special,
    )
    .expect("grammar") else {
        panic!("a Lark grammar")
    };
    assert!(text.contains("<[5]>"), "{text}");
    assert!(!text.contains("\"[TOOL_CALLS]\""), "{text}");
}
