//! Markers that are special tokens in the model's vocabulary: named by id
//! in the grammar, whole or inside a longer marker.

use super::*;

/// Markers that are special tokens are named by id: here three of
/// SmolLM2's control tokens stand in for Hermes' markers and `</think>`,
/// as `[TOOL_CALLS]` or Gemma 4's `<|tool_call>` are special in their
/// models' vocabularies.
#[test]
fn markers_that_are_special_tokens_are_matched_by_id() {
    let tok = tokenizer();
    let id = |text: &str| {
        tok.special_token_id(text)
            .unwrap_or_else(|| panic!("{text} is special"))
    };
    let (open, close, think_close) = (id("<repo_name>"), id("<file_sep>"), id("<filename>"));
    let stand_in = move |text: &str| match text {
        "<tool_call>" => Some(open),
        "</tool_call>" => Some(close),
        "</think>" => Some(think_close),
        _ => None,
    };
    let encode = |text: &str| tok.encode(text, false).expect("encode");
    let call = |name: &str| {
        let mut ids = vec![open];
        ids.extend(encode(&format!(
            "\n{{\"name\": \"{name}\", \"arguments\": {{\"city\": \"Paris\"}}}}\n"
        )));
        ids.push(close);
        ids
    };
    let takes = |spec: &GrammarSpec, ids: &[u32]| {
        let mut constraint = env()
            .constraint(spec)
            .unwrap_or_else(|e| panic!("{e}\n{spec:?}"));
        let allowed = constraint.validate(ids).expect("validate");
        let end = allowed == ids.len()
            && constraint
                .masks(ids)
                .expect("masks")
                .last()
                .is_some_and(|m| m.end_allowed);
        (allowed == ids.len(), end)
    };
    let think = Reasoning::detect("<think></think>").expect("think");
    let tools = [weather()];
    let required = output_grammar(
        Some((&think, true)),
        Some(ToolFormat::Hermes),
        &tools,
        &ToolChoice::Required,
        false,
        None,
        &stand_in,
    )
    .expect("grammar")
    .expect("a constraint");
    let mut ids = encode("Paris, then.");
    ids.push(think_close);
    ids.extend(call("get_weather"));
    assert_eq!(takes(&required, &ids), (true, true), "{required:?}");
    let mut text_markers = encode("Paris, then.</think>");
    text_markers.extend(call("get_weather"));
    assert!(
        !takes(&required, &text_markers).0,
        "the marker's text is not the token"
    );
    let auto = output_grammar(
        None,
        Some(ToolFormat::Hermes),
        &tools,
        &ToolChoice::Auto,
        true,
        None,
        &stand_in,
    )
    .expect("grammar")
    .expect("a constraint");
    let mut ids = encode("Let me check. ");
    ids.extend(call("get_weather"));
    assert_eq!(takes(&auto, &ids), (true, true), "{auto:?}");
    let mut unknown = encode("Let me check. ");
    unknown.extend(call("get_forecast"));
    assert!(!takes(&auto, &unknown).0);
    assert_eq!(
        takes(&auto, &encode("Just prose, <tool_call> as text.")),
        (true, true)
    );
}

/// A marker made of a special token and text (Gemma 4's reasoning opens
/// with the token `<|channel>` then the text `thought`) is matched piecewise.
#[test]
fn markers_mixing_special_tokens_and_text_are_matched_piecewise() {
    let tok = tokenizer();
    let id = |text: &str| {
        tok.special_token_id(text)
            .unwrap_or_else(|| panic!("{text} is special"))
    };
    let (open, close) = (id("<gh_stars>"), id("<filename>"));
    let stand_in = move |text: &str| match text {
        "<|channel>" => Some(open),
        "<channel|>" => Some(close),
        _ => None,
    };
    let channel = Reasoning::detect("<|channel>thought\n<channel|>").expect("channel");
    let spec = output_grammar(
        Some((&channel, false)),
        Some(ToolFormat::Hermes),
        &[weather()],
        &ToolChoice::Required,
        false,
        None,
        &stand_in,
    )
    .expect("grammar")
    .expect("a constraint");
    let encode = |text: &str| tok.encode(text, false).expect("encode");
    let mut ids = vec![open];
    ids.extend(encode("thought\nThe user wants Paris."));
    ids.push(close);
    ids.extend(encode("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
    let mut constraint = env()
        .constraint(&spec)
        .unwrap_or_else(|e| panic!("{e}\n{spec:?}"));
    assert_eq!(
        constraint.validate(&ids).expect("validate"),
        ids.len(),
        "{spec:?}"
    );
    let mut wrong = vec![open];
    wrong.extend(encode("answer\nx"));
    assert!(
        constraint.validate(&wrong).expect("validate") < wrong.len(),
        "the channel's name is text"
    );
}
