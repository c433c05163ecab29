//! Tool schemas with `$defs` references (as pydantic writes them) keep
//! working inside the call wrappers each format puts around them.

use super::*;

fn locate() -> Tool {
    Tool {
        name: "locate".into(),
        description: None,
        parameters: json!({
            "type": "object",
            "properties": {"place": {"$ref": "#/$defs/Place"}},
            "required": ["place"],
            "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
        }),
    }
}

#[test]
fn references_resolve_in_every_wrapper() {
    let tools = [locate()];
    let cases = [
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"locate\", \"arguments\": {\"place\": PLACE}}\n</tool_call>",
        ),
        (ToolFormat::Llama3Json, "{\"name\": \"locate\", \"parameters\": {\"place\": PLACE}}"),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS] [{\"name\": \"locate\", \"arguments\": {\"place\": PLACE}}]",
        ),
        (ToolFormat::Mistral, "[TOOL_CALLS]locate[ARGS]{\"place\": PLACE}"),
        (
            ToolFormat::Qwen3Coder,
            "<tool_call>\n<function=locate>\n<parameter=place>\nPLACE\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            ToolFormat::Glm45,
            "<tool_call>locate\n<arg_key>place</arg_key>\n<arg_value>PLACE</arg_value>\n</tool_call>",
        ),
        (
            ToolFormat::Gemma4,
            "<|tool_call>call:locate{place:PLACE}<tool_call|>",
        ),
    ];
    for (format, text) in cases {
        let spec = grammar(None, format, &tools, &ToolChoice::Required, false);
        let (good_place, bad_place) = if format == ToolFormat::Gemma4 {
            ("{city:<|\"|>Paris<|\"|>}", "{town:<|\"|>Paris<|\"|>}")
        } else {
            (r#"{"city": "Paris"}"#, r#"{"town": "Paris"}"#)
        };
        let good = text.replace("PLACE", good_place);
        assert_eq!(
            run(&spec, &good),
            (true, true),
            "{}: {good:?}\n{spec:?}",
            format.id()
        );
        let bad = text.replace("PLACE", bad_place);
        assert!(!run(&spec, &bad).0, "{}: {bad:?}", format.id());
    }
}

/// Pydantic's `Optional[str]` (`anyOf` string or null) is a string: the
/// formats that write strings bare keep doing so.
#[test]
fn optional_strings_stay_bare() {
    let note = Tool {
        name: "note".into(),
        description: None,
        parameters: json!({
            "type": "object",
            "properties": {"text": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
            "required": ["text"]
        }),
    };
    let spec = grammar(
        None,
        ToolFormat::Qwen3Coder,
        std::slice::from_ref(&note),
        &ToolChoice::Required,
        false,
    );
    let bare = "<tool_call>\n<function=note>\n<parameter=text>\nbuy milk\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(run(&spec, bare), (true, true), "{spec:?}");
    let spec = grammar(
        None,
        ToolFormat::Gemma4,
        &[note],
        &ToolChoice::Required,
        false,
    );
    let gemma = "<|tool_call>call:note{text:<|\"|>buy milk<|\"|>}<tool_call|>";
    assert_eq!(run(&spec, gemma), (true, true), "{spec:?}");
}

/// A schema that refers to itself (twice) gives a bounded grammar that
/// still takes a tree of any depth.
#[test]
fn recursive_references_stay_bounded() {
    let tree = Tool {
        name: "tree".into(),
        description: None,
        parameters: json!({
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}},
            "required": ["root"],
            "$defs": {"Node": {
                "type": "object",
                "properties": {"left": {"$ref": "#/$defs/Node"}, "right": {"$ref": "#/$defs/Node"}, "v": {"type": "integer"}},
                "required": ["v"]
            }}
        }),
    };
    let spec = grammar(
        None,
        ToolFormat::Gemma4,
        &[tree],
        &ToolChoice::Required,
        false,
    );
    let GrammarSpec::Lark(text) = &spec else {
        panic!("Lark")
    };
    assert!(text.len() < 200_000, "{} bytes", text.len());
    let mut deep = "{v:1}".to_owned();
    for _ in 0..10 {
        deep = format!("{{left:{deep},v:2}}");
    }
    let call = format!("<|tool_call>call:tree{{root:{deep}}}<tool_call|>");
    assert_eq!(run(&spec, &call), (true, true));
}
