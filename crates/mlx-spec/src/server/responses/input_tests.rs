use serde_json::json;
use spec_text::Message;

use super::{items, messages};

#[test]
fn a_string_is_one_user_message() {
    let got = messages(Some(&json!("hi")), &[]).expect("messages");
    assert_eq!(got, vec![Message::user("hi")]);
}

#[test]
fn a_tool_round_trip_becomes_one_assistant_turn_and_its_results() {
    let input = json!([
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather "},
            {"type": "input_text", "text": "in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
            "content": [{"type": "reasoning_text", "text": "look it up"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_a", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "call_b", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b",
            "output": [{"type": "input_text", "text": "noon"}]},
    ]);
    let got = messages(Some(&input), &[]).expect("messages");
    let mut assistant = Message::assistant_calls(
        "Checking.",
        vec![
            spec_text::tool_call("call_a", "weather", json!({"city": "Paris"})),
            spec_text::tool_call("call_b", "time", json!({})),
        ],
    );
    assistant.reasoning_content = Some("look it up".into());
    assert_eq!(
        got,
        vec![
            Message::system("be brief"),
            Message::user("weather in Paris?"),
            assistant,
            Message::tool("call_a", "weather", "sunny"),
            Message::tool("call_b", "time", "noon"),
        ]
    );
}

#[test]
fn a_call_alone_opens_an_assistant_turn_and_results_may_answer_history() {
    let input = json!([
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
    ]);
    let got = messages(Some(&input), &[Message::user("go")]).expect("messages");
    assert_eq!(
        got,
        vec![Message::assistant_calls(
            "",
            vec![spec_text::tool_call("c1", "f", json!({"x": 1}))]
        )]
    );
    // A stored turn's call is answered by the next request's input.
    let history = vec![Message::assistant_calls(
        "",
        vec![spec_text::tool_call("c9", "g", json!({}))],
    )];
    let output = json!([{"type": "function_call_output", "call_id": "c9", "output": "ok"}]);
    assert_eq!(
        messages(Some(&output), &history).expect("messages"),
        vec![Message::tool("c9", "g", "ok")]
    );
}

#[test]
fn bad_items_are_400s_naming_the_item() {
    let cases = [
        (json!(null), "`input` is required"),
        (json!([]), "must not be an empty list"),
        (json!(7), "a string or a list"),
        (json!([3]), "`input[0]` must be an object"),
        (json!([{"content": "x"}]), "`input[0].type` is required"),
        (
            json!([{"role": "robot", "content": "x"}]),
            "unsupported role `robot`",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            "`input[0].content[0]`: `input_image` is not supported",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_text"}]}]),
            "has no text",
        ),
        (
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]),
            "`input[0].arguments` is not JSON",
        ),
        (
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]),
            "must be a JSON object",
        ),
        (
            json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
            "`input[0].call_id` must be a non-empty string",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "nope", "output": "x"}]),
            "`nope` answers no earlier function_call",
        ),
        (
            json!([{"type": "item_reference", "id": "msg_1"}]),
            "`item_reference` is not supported",
        ),
        (
            json!([{"type": "web_search_call", "id": "w"}]),
            "unsupported item type `web_search_call`",
        ),
    ];
    for (input, expected) in cases {
        let e = messages(Some(&input), &[]).expect_err(&input.to_string());
        assert_eq!(e.param, Some("input"), "{input}");
        assert!(e.message.contains(expected), "{input}: {}", e.message);
    }
}

#[test]
fn input_items_are_listed_with_types_ids_and_text_parts() {
    assert_eq!(
        items(&json!("hi"), "resp_abc"),
        vec![
            json!({"id": "msg_abc_in0", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": "hi"}]})
        ]
    );
    let input = json!([
        {"role": "assistant", "content": "done"},
        {"type": "function_call", "id": "fc_mine", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ]);
    let listed = items(&input, "resp_x");
    assert_eq!(
        listed[0]["content"],
        json!([{"type": "output_text", "text": "done"}])
    );
    let ids: Vec<&str> = listed.iter().filter_map(|i| i["id"].as_str()).collect();
    assert_eq!(ids, ["msg_x_in0", "fc_mine", "fco_x_in2"]);
    assert!(listed.iter().all(|i| i["status"] == json!("completed")));
}
