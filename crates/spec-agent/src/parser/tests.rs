//! The state machine on synthetic text: reasoning, content, calls, held
//! markers, and malformed calls returned as content.

use serde_json::json;

use super::*;

fn think() -> Reasoning {
    Reasoning::detect("<think></think>").expect("think markers")
}

/// The whole-response view of `text` pushed in chunks of `size` bytes
/// (rounded to character boundaries).
pub(crate) fn parse_chunked(parser: &mut OutputParser, text: &str, size: usize) -> Parsed {
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.extend(parser.push(&text[at..end]));
        at = end;
    }
    pieces.extend(parser.finish());
    Parsed::of(&pieces)
}

/// Parses `text` in one push and in odd-sized chunks; all must agree.
fn check(
    format: Option<ToolFormat>,
    reasoning: Option<Reasoning>,
    open: bool,
    text: &str,
) -> Parsed {
    let whole = parse_chunked(
        &mut OutputParser::new(format, reasoning.clone(), open, &[]),
        text,
        usize::MAX / 2,
    );
    for size in [1, 2, 3, 5, 7, 11] {
        let chunked = parse_chunked(
            &mut OutputParser::new(format, reasoning.clone(), open, &[]),
            text,
            size,
        );
        assert_eq!(chunked, whole, "chunks of {size}: {text:?}");
    }
    whole
}

fn call(name: &str, arguments: serde_json::Value) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

#[test]
fn text_before_a_call_stays_content() {
    let parsed = check(
        Some(ToolFormat::Hermes),
        None,
        false,
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    assert_eq!(parsed.content, "Let me check.\n");
    assert_eq!(
        parsed.calls,
        vec![call("get_weather", json!({"city": "Paris"}))]
    );
}

#[test]
fn malformed_and_unclosed_calls_are_content() {
    let bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> after";
    let parsed = check(Some(ToolFormat::Hermes), None, false, bad);
    assert_eq!(parsed.content, bad);
    assert!(parsed.calls.is_empty());
    let unclosed = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
    let parsed = check(Some(ToolFormat::Hermes), None, false, unclosed);
    assert_eq!((parsed.content.as_str(), parsed.calls.len()), (unclosed, 0));
    // A marker-like text that is no marker is content, held only while undecided.
    let mut parser = OutputParser::new(Some(ToolFormat::Hermes), None, false, &[]);
    assert_eq!(parser.push("a <tool"), vec![Piece::Content("a ".into())]);
    assert_eq!(
        parser.push("s> b"),
        vec![Piece::Content("<tools> b".into())]
    );
}

#[test]
fn reasoning_splits_from_content() {
    let text = "<think>\nTwo and two.\n</think>\n\nIt is 4.";
    let parsed = check(None, Some(think()), false, text);
    assert_eq!(parsed.reasoning, "Two and two.\n");
    assert_eq!(parsed.content, "It is 4.");
    // The prompt opened it: the text starts inside.
    let parsed = check(
        None,
        Some(think()),
        true,
        "Two and two.\n</think>\n\nIt is 4.",
    );
    assert_eq!(
        (parsed.reasoning.as_str(), parsed.content.as_str()),
        ("Two and two.\n", "It is 4.")
    );
    // No reasoning at all is content; an unclosed one stays reasoning.
    assert_eq!(
        check(None, Some(think()), false, "It is 4.").content,
        "It is 4."
    );
    let cut = check(None, Some(think()), true, "Still thinking");
    assert_eq!(
        (cut.reasoning.as_str(), cut.content.as_str()),
        ("Still thinking", "")
    );
}

#[test]
fn reasoning_then_calls() {
    let text = "<think>I need the weather.</think>\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1]}}\n</tool_call>";
    let parsed = check(Some(ToolFormat::Hermes), Some(think()), false, text);
    assert_eq!(parsed.reasoning, "I need the weather.");
    assert_eq!(parsed.content, "");
    assert_eq!(
        parsed.calls,
        vec![call("a", json!({})), call("b", json!({"x": [1]}))]
    );
    let pieces = OutputParser::new(Some(ToolFormat::Hermes), None, false, &[]).push(&text[26..]);
    let indices: Vec<usize> = pieces
        .iter()
        .filter_map(|p| match p {
            Piece::CallStart { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(indices, vec![0, 1]);
}

#[test]
fn llama_calls_open_only_where_the_response_begins() {
    let parsed = check(
        Some(ToolFormat::Llama3Json),
        None,
        false,
        " {\"name\": \"f\", \"parameters\": {\"n\": 1}}",
    );
    assert_eq!(parsed.calls, vec![call("f", json!({"n": 1}))]);
    let prose = "Use {\"name\": \"f\"} like this.";
    assert_eq!(
        check(Some(ToolFormat::Llama3Json), None, false, prose).content,
        prose
    );
    let json_answer = "{\"answer\": 4}";
    let parsed = check(Some(ToolFormat::Llama3Json), None, false, json_answer);
    assert_eq!(
        (parsed.content.as_str(), parsed.calls.len()),
        (json_answer, 0)
    );
    let tagged = check(
        Some(ToolFormat::Llama3Json),
        None,
        false,
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
    );
    assert_eq!(tagged.calls, vec![call("f", json!({}))]);
}

#[test]
fn without_a_format_everything_is_content() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    assert_eq!(check(None, None, false, text).content, text);
}

#[test]
fn harmony_messages_split_by_channel_and_recipient() {
    let harmony = Some(crate::reasoning::HARMONY);
    let format = Some(ToolFormat::Harmony);
    let text = "<|channel|>analysis<|message|>Need the weather.<|end|>\
        <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    let parsed = check(format, harmony.clone(), false, text);
    assert_eq!(parsed.reasoning, "Need the weather.");
    assert_eq!(parsed.content, "Checking.");
    assert_eq!(
        parsed.calls,
        [ParsedCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}).to_string()
        }]
    );
    // The final channel, ended by `<|return|>` or by the end of generation.
    for end in ["<|return|>", ""] {
        let text = format!("<|channel|>final<|message|>It is sunny.{end}");
        let parsed = check(format, harmony.clone(), false, &text);
        assert_eq!(
            (parsed.reasoning.as_str(), parsed.content.as_str()),
            ("", "It is sunny.")
        );
    }
    // Without tools (no format) a message to a function is text; so is one
    // to a tool we do not serve, and arguments that are no JSON object.
    let call = "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}";
    let parsed = check(None, harmony.clone(), false, call);
    assert!(parsed.calls.is_empty());
    assert_eq!(
        parsed.content,
        "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}"
    );
    let parsed = check(
        format,
        harmony.clone(),
        false,
        "<|channel|>analysis to=browser.search<|message|>{\"q\": 1}",
    );
    assert!(parsed.calls.is_empty() && parsed.content.contains("browser.search"));
    let parsed = check(
        format,
        harmony.clone(),
        false,
        "<|channel|>commentary to=functions.f<|message|>{\"a\": 1",
    );
    assert!(parsed.calls.is_empty());
    assert!(parsed.content.contains("to=functions.f") && parsed.content.ends_with("{\"a\": 1"));
    // Text outside any message (a model that writes no harmony) is content;
    // a header that never reaches `<|message|>` is content too.
    let parsed = check(format, harmony.clone(), false, "Just text, to=nobody.");
    assert_eq!(parsed.content, "Just text, to=nobody.");
    let parsed = check(
        format,
        harmony.clone(),
        false,
        "<|channel|>final no message<|end|>Then text.",
    );
    assert_eq!(
        parsed.content,
        "<|channel|>final no message<|end|>Then text."
    );
    // A broken header ends at its end marker; a message may follow. One
    // that runs past the header's reach is text up to where it stopped,
    // whatever the chunks.
    let parsed = check(
        format,
        harmony.clone(),
        false,
        "<|channel|>final no message<|end|><|start|>assistant<|channel|>final<|message|>Hi",
    );
    assert_eq!(parsed.content, "<|channel|>final no message<|end|>Hi");
    let long = format!("<|channel|>final {}<|message|>Hi", "x".repeat(300));
    let parsed = check(format, harmony.clone(), false, &long);
    assert_eq!(parsed.content, long);
    // A body cut short by the next message's start.
    let parsed = check(
        format,
        harmony,
        false,
        "<|channel|>analysis<|message|>Hmm<|start|>assistant<|channel|>final<|message|>Done",
    );
    assert_eq!(
        (parsed.reasoning.as_str(), parsed.content.as_str()),
        ("Hmm", "Done")
    );
}
