//! Chat Completions' answer shapes from a turn's pieces: the whole
//! `message` (`content`, `reasoning_content`, `tool_calls` with their ids
//! and JSON-string arguments), the stream's `delta`s (a call's first chunk
//! carries its id, type and name, later ones its argument text), and
//! `finish_reason: "tool_calls"` when the answer called.

use serde_json::{json, Map, Value};
use spec_agent::{Parsed, Piece};

use crate::random::fresh_u64;

/// A fresh call id: `call_` and 24 random hex digits.
pub fn call_id() -> String {
    let (high, low) = (fresh_u64(), fresh_u64());
    format!("call_{:016x}{:08x}", high, low as u32)
}

/// The ids of a response's calls, given as the calls open.
#[derive(Debug, Default)]
pub struct CallIds(Vec<String>);

impl CallIds {
    /// The id of call `index`, made when first asked for.
    pub fn get(&mut self, index: usize) -> &str {
        while self.0.len() <= index {
            self.0.push(call_id());
        }
        &self.0[index]
    }
}

/// OpenAI's finish reason: the engine's (`stop`, `length`), or
/// `tool_calls` when an answer that ended by itself holds calls.
pub fn finish_reason(engine: &'static str, calls: usize) -> &'static str {
    if calls > 0 && engine == "stop" {
        "tool_calls"
    } else {
        engine
    }
}

/// One call in OpenAI's shape.
fn call_json(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// The whole answer's `message`: `content` is `null` when the answer only
/// called; `reasoning_content` and `tool_calls` appear when there are any.
pub fn message(parsed: &Parsed, ids: &mut CallIds) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    let content = if parsed.content.is_empty() && !parsed.calls.is_empty() {
        Value::Null
    } else {
        json!(parsed.content)
    };
    message.insert("content".into(), content);
    if !parsed.reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(parsed.reasoning));
    }
    if !parsed.calls.is_empty() {
        let calls: Vec<Value> = parsed
            .calls
            .iter()
            .enumerate()
            .map(|(i, call)| call_json(ids.get(i), &call.name, &call.arguments))
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(message)
}

/// The stream `delta` for a piece; `None` for one that shows nothing (a
/// call's end, empty text).
pub fn delta(piece: &Piece, ids: &mut CallIds) -> Option<Value> {
    Some(match piece {
        Piece::Reasoning(text) | Piece::Content(text) if text.is_empty() => return None,
        Piece::Reasoning(text) => json!({"reasoning_content": text}),
        Piece::Content(text) => json!({"content": text}),
        Piece::CallStart { index, name } => json!({"tool_calls": [{"index": index,
            "id": ids.get(*index), "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
        Piece::CallArguments { index, json } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": json}}]})
        }
        Piece::CallEnd { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces() -> Vec<Piece> {
        vec![
            Piece::Reasoning("The user wants weather.".into()),
            Piece::Content("Checking.".into()),
            Piece::CallStart {
                index: 0,
                name: "get_weather".into(),
            },
            Piece::CallArguments {
                index: 0,
                json: "{\"city\": ".into(),
            },
            Piece::CallArguments {
                index: 0,
                json: "\"Paris\"}".into(),
            },
            Piece::CallEnd { index: 0 },
            Piece::CallStart {
                index: 1,
                name: "get_time".into(),
            },
            Piece::CallArguments {
                index: 1,
                json: "{}".into(),
            },
            Piece::CallEnd { index: 1 },
        ]
    }

    /// The stream's deltas, merged as OpenAI's clients merge them, give
    /// the whole answer's message, ids included.
    #[test]
    fn deltas_merge_into_the_whole_message() {
        let mut parsed = Parsed::default();
        let mut ids = CallIds::default();
        let mut content = String::new();
        let mut reasoning = String::new();
        let mut calls: Vec<Value> = Vec::new();
        for piece in pieces() {
            parsed.push(&piece);
            let Some(delta) = delta(&piece, &mut ids) else {
                continue;
            };
            content += delta["content"].as_str().unwrap_or("");
            reasoning += delta["reasoning_content"].as_str().unwrap_or("");
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().expect("index") as usize;
                if index == calls.len() {
                    assert_eq!(call["function"]["arguments"], "", "a call opens empty");
                    let mut opened = call.clone();
                    opened.as_object_mut().expect("object").remove("index");
                    calls.push(opened);
                } else {
                    assert!(call.get("id").is_none() && call["function"].get("name").is_none());
                    let so_far = calls[index]["function"]["arguments"]
                        .as_str()
                        .expect("text")
                        .to_owned();
                    calls[index]["function"]["arguments"] =
                        json!(so_far + call["function"]["arguments"].as_str().expect("text"));
                }
            }
        }
        let whole = message(&parsed, &mut ids);
        assert_eq!(whole["content"], json!(content));
        assert_eq!(whole["reasoning_content"], json!(reasoning));
        assert_eq!(whole["tool_calls"], Value::Array(calls));
        assert_eq!(
            whole["tool_calls"][0]["function"]["arguments"],
            "{\"city\": \"Paris\"}"
        );
        let first = whole["tool_calls"][0]["id"].as_str().expect("id");
        let second = whole["tool_calls"][1]["id"].as_str().expect("id");
        assert!(first.starts_with("call_") && first.len() == 29, "{first}");
        assert_ne!(first, second);
        assert_eq!(finish_reason("stop", parsed.calls.len()), "tool_calls");
        assert_eq!(finish_reason("length", parsed.calls.len()), "length");
    }

    #[test]
    fn content_is_null_only_when_the_answer_only_called() {
        let mut parsed = Parsed::default();
        for piece in &pieces()[2..6] {
            parsed.push(piece);
        }
        let only_calls = message(&parsed, &mut CallIds::default());
        assert_eq!(only_calls["content"], Value::Null);
        assert!(only_calls.get("reasoning_content").is_none());
        let mut text = Parsed::default();
        text.push(&Piece::Content("Hello".into()));
        let plain = message(&text, &mut CallIds::default());
        assert_eq!(plain, json!({"role": "assistant", "content": "Hello"}));
        assert_eq!(
            message(&Parsed::default(), &mut CallIds::default())["content"],
            ""
        );
        assert_eq!(finish_reason("stop", 0), "stop");
    }
}
