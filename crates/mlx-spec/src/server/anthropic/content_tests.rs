//! Turns and blocks into chat messages, and their refusals.
use super::*;

fn translate(messages: Value) -> Result<Vec<Message>, ApiError> {
    super::messages(Some(&messages), None)
}

fn refused(messages: Value, fragment: &str) {
    let err = translate(messages.clone()).expect_err("must be refused");
    assert_eq!(
        (err.status.as_u16(), err.param),
        (400, Some("messages")),
        "{messages}"
    );
    assert!(
        err.message.contains(fragment),
        "{messages}: {}",
        err.message
    );
}

#[test]
fn a_tool_round_trip_becomes_calls_and_tool_messages_in_order() {
    let out = super::messages(
        Some(&json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should look.", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "noon", "is_error": true},
                {"type": "text", "text": "And tomorrow?"}]},
        ])),
        Some("Be brief.".to_owned()),
    )
    .expect("valid");
    let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "user"]
    );
    assert_eq!(out[0].content, "Be brief.");
    let assistant = &out[2];
    assert_eq!(assistant.content, "Checking.");
    assert_eq!(
        assistant.reasoning_content.as_deref(),
        Some("I should look.")
    );
    assert_eq!(
        assistant.tool_calls,
        Some(vec![
            json!({"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}),
            json!({"id": "toolu_2", "type": "function", "function": {"name": "time", "arguments": {}}}),
        ])
    );
    assert_eq!(
        (
            out[3].tool_call_id.as_deref(),
            out[3].name.as_deref(),
            out[3].content.as_str()
        ),
        (Some("toolu_1"), Some("weather"), "sunny")
    );
    assert_eq!(out[4].content, "Error: noon");
    assert_eq!(out[5].content, "And tomorrow?");
}

#[test]
fn text_blocks_of_a_turn_join_and_system_takes_blocks() {
    let out = super::messages(
        Some(&json!([{"role": "user", "content": [
            {"type": "text", "text": "one"}, {"type": "redacted_thinking", "data": "x"},
            {"type": "text", "text": "two", "cache_control": {"type": "ephemeral"}}]}])),
        system(Some(
            &json!([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]),
        ))
        .expect("valid"),
    )
    .expect("valid");
    assert_eq!(out[0].content, "A\n\nB");
    assert_eq!(out[1].content, "one\n\ntwo");
    assert_eq!(
        out[1].tool_calls, None,
        "nothing new serialized for plain turns"
    );
    assert_eq!(system(Some(&json!(""))).expect("valid"), None);
    let err = system(Some(&json!([{"type": "image"}]))).expect_err("text only");
    assert!(err.message.contains("system[0].type"), "{}", err.message);
}

#[test]
fn bad_turns_are_400s_naming_the_block() {
    refused(
        json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]),
        "messages[0].content[0].tool_use_id: `toolu_9` answers no `tool_use`",
    );
    refused(
        json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}]),
        "messages[0].content[1].type: unknown or unsupported content block type `video`",
    );
    refused(
        json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
        "`image`",
    );
    refused(
        json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
        "a `tool_use` block cannot be in a `user` turn",
    );
    refused(
        json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}]),
        "messages[0].content[0].input: field required (a JSON object)",
    );
    refused(
        json!([{"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}},
            {"type": "tool_use", "id": "a", "name": "g", "input": {}}]}]),
        "repeats an earlier tool_use id",
    );
    refused(
        json!([{"role": "robot", "content": "hi"}]),
        "messages[0].role: unknown role `robot`",
    );
    refused(
        json!([{"role": "user"}]),
        "messages[0].content: field required",
    );
    refused(
        json!([{"role": "user", "content": [{"text": "no type"}]}]),
        "content[0].type: field required",
    );
    refused(json!([]), "at least one message");
    // A result before its call, in the same request, is refused too.
    refused(
        json!([
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "late"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "late", "name": "f", "input": {}}]}]),
        "`late` answers no `tool_use`",
    );
}
