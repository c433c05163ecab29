use serde_json::{json, Value};
use spec_agent::Piece;

use super::{Event, Output};

fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.name).collect()
}

/// Runs `pieces` through a machine; its events (start to finish) and it.
fn run(pieces: &[Piece], complete: bool) -> (Vec<Event>, Output) {
    let mut out = Output::new("resp_abc");
    let mut events = Vec::new();
    for p in pieces {
        events.extend(out.piece(p));
    }
    events.extend(out.finish(complete));
    (events, out)
}

#[test]
fn reasoning_text_and_a_call_become_three_items_in_order() {
    let pieces = [
        Piece::Reasoning("think".into()),
        Piece::Content("\n\n".into()),
        Piece::Content("Hello".into()),
        Piece::Content(" there".into()),
        Piece::CallStart {
            index: 0,
            name: "f".into(),
        },
        Piece::CallArguments {
            index: 0,
            json: "{\"a\":".into(),
        },
        Piece::CallArguments {
            index: 0,
            json: "1}".into(),
        },
        Piece::CallEnd { index: 0 },
    ];
    let (events, out) = run(&pieces, true);
    assert_eq!(
        names(&events),
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
    );
    // Numbered from 0 without gaps; every item event names its index.
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e.data["sequence_number"], json!(n));
        assert_eq!(e.data["type"], json!(e.name));
    }
    let items = out.items();
    assert_eq!(items.len(), 3);
    assert_eq!(
        items[0],
        json!({"id": "rs_abc_0", "type": "reasoning", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": "think"}]})
    );
    // The blank lines after the reasoning belong to no item.
    assert_eq!(items[1]["content"][0]["text"], json!("Hello there"));
    assert_eq!(items[1]["id"], json!("msg_abc_1"));
    assert_eq!(items[2]["arguments"], json!("{\"a\":1}"));
    assert!(items[2]["call_id"]
        .as_str()
        .is_some_and(|c| c.starts_with("call_")));
    assert_eq!(events[13].data["item"]["arguments"], json!(""));
    assert_eq!(events[13].data["output_index"], json!(2));
    // What a later turn sends back.
    let message = out.message();
    assert_eq!(
        (
            message.content.as_str(),
            message.reasoning_content.as_deref()
        ),
        ("Hello there", Some("think"))
    );
    assert_eq!(
        message.tool_calls.as_ref().map(Vec::len),
        Some(1),
        "{message:?}"
    );
}

#[test]
fn a_cut_answer_is_incomplete_and_log_probabilities_ride_on_deltas() {
    let mut out = Output::new("resp_x");
    let mut events = Vec::new();
    out.logprobs(vec![json!({"token": "Hi"})]);
    events.extend(out.piece(&Piece::Content("Hi".into())));
    out.logprobs(vec![json!({"token": " yo"})]);
    events.extend(out.finish(false));
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|e| e.name == "response.output_text.delta")
        .map(|e| &e.data)
        .collect();
    assert_eq!(deltas.len(), 2, "the held entries come with an empty delta");
    assert_eq!(deltas[1]["delta"], json!(""));
    let item = &out.items()[0];
    assert_eq!(item["status"], json!("incomplete"));
    assert_eq!(
        item["content"][0]["logprobs"],
        json!([{"token": "Hi"}, {"token": " yo"}])
    );
    let done = events
        .iter()
        .find(|e| e.name == "response.output_item.done")
        .expect("the item closed");
    assert_eq!(done.data["item"]["status"], json!("incomplete"));
}

#[test]
fn blank_text_before_a_call_makes_no_item() {
    let pieces = [
        Piece::Content("  \n".into()),
        Piece::CallStart {
            index: 0,
            name: "f".into(),
        },
        Piece::CallArguments {
            index: 0,
            json: "{}".into(),
        },
        Piece::CallEnd { index: 0 },
        Piece::Content("\n".into()),
    ];
    let (_, out) = run(&pieces, true);
    let items = out.items();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["type"], json!("function_call"));
    assert_eq!(out.message().content, "");
}
