//! The event machine over piece sequences, and the content a client
//! accumulates from its events.

use super::*;
use crate::server::anthropic::response;

fn content(text: &str) -> Piece {
    Piece::Content(text.to_owned())
}

fn call(index: usize, name: &str, args: &[&str]) -> Vec<Piece> {
    let mut pieces = vec![Piece::CallStart {
        index,
        name: name.to_owned(),
    }];
    pieces.extend(args.iter().map(|a| Piece::CallArguments {
        index,
        json: (*a).to_owned(),
    }));
    pieces.push(Piece::CallEnd { index });
    pieces
}

/// Every event of a whole message from `pieces`.
fn run(pieces: &[Piece], finish_reason: &str, stop: Option<&str>) -> (Vec<Event>, Events) {
    let mut machine = Events::new("msg_abc");
    let mut events = machine.start("m", response::usage(10, 0, 0));
    for piece in pieces {
        events.extend(machine.piece(piece));
    }
    let ending = Ending::new(finish_reason, stop.map(str::to_owned), machine.called());
    events.extend(machine.finish(&ending, json!({"output_tokens": 7})));
    (events, machine)
}

/// The event order Anthropic's clients rely on: message_start, ping, then
/// blocks opened with consecutive indices from 0, each delta and stop on
/// the one open block, message_delta, message_stop.
fn check_order(events: &[Event]) {
    let names: Vec<&str> = events.iter().map(|e| e.name).collect();
    assert_eq!(&names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(
        &names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    let mut open: Option<u64> = None;
    let mut next = 0;
    for e in &events[2..events.len() - 2] {
        let index = e.data["index"].as_u64().expect("an index");
        assert_eq!(
            e.data["type"], e.name,
            "the data's type is the event's name"
        );
        match e.name {
            "content_block_start" => {
                assert_eq!((open, index), (None, next), "{names:?}");
                open = Some(index);
                next += 1;
            }
            "content_block_delta" => assert_eq!(open, Some(index), "{names:?}"),
            "content_block_stop" => {
                assert_eq!(open, Some(index), "{names:?}");
                open = None;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(open, None, "every block stopped before message_delta");
}

#[test]
fn thinking_then_text_then_a_call() {
    let mut pieces = vec![
        Piece::Reasoning("Let me ".into()),
        Piece::Reasoning("see.".into()),
        content("\n\n"),
        content("Checking"),
        content(" now."),
        content("\n"),
    ];
    pieces.extend(call(0, "get_weather", &["{\"city\": ", "\"Paris\"}"]));
    let (events, machine) = run(&pieces, "stop", None);
    check_order(&events);
    assert!(machine.called());
    let blocks = response::content(&events);
    assert_eq!(
        blocks,
        vec![
            json!({"type": "thinking", "thinking": "Let me see.", "signature": ""}),
            json!({"type": "text", "text": "Checking now.\n"}),
            json!({"type": "tool_use", "id": "toolu_abc_0", "name": "get_weather",
                "input": {"city": "Paris"}}),
        ]
    );
    let delta = &events[events.len() - 2].data;
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "tool_use", "stop_sequence": null})
    );
    assert_eq!(delta["usage"]["output_tokens"], 7);
    let start = &events[0].data["message"];
    assert_eq!(
        (
            start["id"].as_str(),
            start["content"].clone(),
            start["usage"]["input_tokens"].as_u64()
        ),
        (Some("msg_abc"), json!([]), Some(10))
    );
}

#[test]
fn a_first_text_block_keeps_its_leading_space() {
    let (events, _) = run(&[content("\n"), content(" Hi")], "stop", None);
    assert_eq!(
        response::content(&events),
        vec![json!({"type": "text", "text": "\n Hi"})]
    );
}

#[test]
fn whitespace_between_calls_makes_no_text_block() {
    let mut pieces = call(0, "a", &["{}"]);
    pieces.push(content("\n"));
    pieces.extend(call(1, "b", &["{\"x\"", ": 1}"]));
    pieces.push(content(" \n"));
    let (events, _) = run(&pieces, "stop", None);
    check_order(&events);
    let blocks = response::content(&events);
    let kinds: Vec<&str> = blocks
        .iter()
        .map(|b| b["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["tool_use", "tool_use"]);
    assert_eq!(blocks[1]["input"], json!({"x": 1}));
    assert_ne!(blocks[0]["id"], blocks[1]["id"]);
    let partial: Vec<&str> = events
        .iter()
        .filter_map(|e| e.data["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        partial,
        ["{}", "{\"x\"", ": 1}"],
        "arguments go out as they come"
    );
}

#[test]
fn text_only_answers_and_their_stop_reasons() {
    for (finish, stop, reason, sequence) in [
        ("stop", None, "end_turn", None),
        ("length", None, "max_tokens", None),
        ("stop", Some("END"), "stop_sequence", Some("END")),
        ("length", Some("END"), "max_tokens", None),
    ] {
        let (events, _) = run(&[content("Paris"), content(".")], finish, stop);
        check_order(&events);
        assert_eq!(
            response::content(&events),
            vec![json!({"type": "text", "text": "Paris."})]
        );
        let delta = &events[events.len() - 2].data["delta"];
        assert_eq!(
            (
                delta["stop_reason"].as_str(),
                delta["stop_sequence"].as_str()
            ),
            (Some(reason), sequence),
            "{finish} {stop:?}"
        );
    }
    // Nothing generated: no block at all.
    let (events, _) = run(&[content(""), content("  ")], "stop", None);
    check_order(&events);
    assert!(response::content(&events).is_empty());
}

#[test]
fn a_call_wins_over_a_stop_sequence_but_not_over_max_tokens() {
    assert_eq!(Ending::new("stop", None, true).stop_reason, "tool_use");
    assert_eq!(
        Ending::new("stop", Some("x".into()), true).stop_sequence,
        None
    );
    assert_eq!(Ending::new("length", None, true).stop_reason, "max_tokens");
}

#[test]
fn arguments_of_a_call_not_open_are_dropped() {
    let mut machine = Events::new("msg_x");
    let stray = machine.piece(&Piece::CallArguments {
        index: 3,
        json: "{}".into(),
    });
    assert!(stray.is_empty());
    assert!(machine.piece(&Piece::CallEnd { index: 3 }).is_empty());
}

#[test]
fn errors_mid_stream_are_error_events_in_anthropics_shape() {
    let e = super::error_event(&ApiError::internal("the engine failed"));
    assert_eq!(e.name, "error");
    assert_eq!(
        e.data,
        json!({"type": "error", "error": {"type": "api_error", "message": "the engine failed"}})
    );
}

/// Piece sequences of every shape (seeded, so a failure reproduces): the
/// events keep Anthropic's order, and the accumulated blocks hold exactly
/// the reasoning, the text (less whitespace between blocks) and the calls
/// the pieces held.
#[test]
fn any_piece_sequence_keeps_the_order_and_loses_nothing() {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let words = ["a", " b", "\n", "  ", "c\n", ""];
    for round in 0..300 {
        let mut pieces = Vec::new();
        let mut calls = 0;
        for _ in 0..next(12) {
            match next(4) {
                0 => pieces.push(Piece::Reasoning(words[next(6) as usize].into())),
                1 | 2 => pieces.push(content(words[next(6) as usize])),
                _ => {
                    let args = ["{\"x\": ", "1}"];
                    pieces.extend(call(calls, "f", &args));
                    calls += 1;
                }
            }
        }
        let (events, machine) = run(&pieces, "stop", None);
        check_order(&events);
        assert_eq!(machine.called(), calls > 0, "round {round}");
        let blocks = response::content(&events);
        let joined = |kind: &str, key: &str| -> String {
            blocks
                .iter()
                .filter(|b| b["type"] == kind)
                .filter_map(|b| b[key].as_str())
                .collect()
        };
        let reasoning: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Reasoning(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(joined("thinking", "thinking"), reasoning, "round {round}");
        let text: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let kept = joined("text", "text");
        // Whitespace between blocks is dropped; every other character stays, in order.
        let squeeze = |s: &str| s.split_whitespace().collect::<String>();
        assert_eq!(squeeze(&kept), squeeze(&text), "round {round}");
        let uses: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(uses.len(), calls, "round {round}");
        assert!(
            uses.iter().all(|u| u["input"] == json!({"x": 1})),
            "round {round}"
        );
        assert!(
            blocks
                .iter()
                .filter(|b| b["type"] == "text")
                .all(|b| !b["text"].as_str().unwrap_or("").trim().is_empty()),
            "no blank text block, round {round}"
        );
    }
}
