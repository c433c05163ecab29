//! Non-streamed Messages answers: the message object, its content blocks
//! accumulated from the stream's events (so both shapes agree by
//! construction), its usage with the prefix cache's hits as
//! `cache_read_input_tokens`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::stream::{Ending, Event};

/// A new message id, `msg_` and 24 hex digits (the time and a counter:
/// unique within a server's life).
pub fn message_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("msg_{nanos:016x}{:08x}", n as u32)
}

/// Token counts: `input_tokens` are the prompt's tokens prefilled, the
/// ones served from the prefix cache are `cache_read_input_tokens` (their
/// sum is the prompt), nothing is billed as cache creation.
pub fn usage(prompt_tokens: usize, cached_tokens: usize, output_tokens: usize) -> Value {
    json!({"input_tokens": prompt_tokens.saturating_sub(cached_tokens),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0})
}

/// The content blocks the events describe, as a client accumulates them:
/// deltas appended to their block, a tool_use's `partial_json` pieces
/// parsed into its `input` object at the end.
pub fn content(events: &[Event]) -> Vec<Value> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    for event in events {
        let data = &event.data;
        let index = data["index"].as_u64().map(|i| i as usize);
        match (event.name, index) {
            ("content_block_start", Some(_)) => {
                blocks.push(data["content_block"].clone());
                inputs.push(String::new());
            }
            ("content_block_delta", Some(i)) if i < blocks.len() => {
                let delta = &data["delta"];
                let (key, piece) = match delta["type"].as_str() {
                    Some("text_delta") => ("text", &delta["text"]),
                    Some("thinking_delta") => ("thinking", &delta["thinking"]),
                    Some("input_json_delta") => {
                        inputs[i].push_str(delta["partial_json"].as_str().unwrap_or(""));
                        continue;
                    }
                    _ => continue,
                };
                let joined = format!(
                    "{}{}",
                    blocks[i][key].as_str().unwrap_or(""),
                    piece.as_str().unwrap_or("")
                );
                blocks[i][key] = Value::String(joined);
            }
            _ => {}
        }
    }
    for (block, input) in blocks.iter_mut().zip(inputs) {
        if block["type"] == "tool_use" && !input.is_empty() {
            block["input"] = match serde_json::from_str::<Map<String, Value>>(&input) {
                Ok(object) => Value::Object(object),
                Err(e) => {
                    // The parser hands only well-formed calls on; should one
                    // slip through, the client still gets an object.
                    tracing::warn!(error = %e, "a tool call's arguments are not a JSON object");
                    json!({})
                }
            };
        }
    }
    blocks
}

/// The whole message.
pub fn message(
    id: &str,
    model: &str,
    content: Vec<Value>,
    ending: &Ending,
    usage: Value,
    speculative: Value,
) -> Value {
    json!({"id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": ending.stop_reason,
        "stop_sequence": ending.stop_sequence, "usage": usage,
        "speculative": speculative})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_unique_and_shaped() {
        let a = message_id();
        let b = message_id();
        assert_ne!(a, b);
        assert!(a.starts_with("msg_") && a.len() == 28, "{a}");
    }

    #[test]
    fn usage_splits_the_prompt_into_read_and_prefilled() {
        assert_eq!(
            usage(30, 12, 5),
            json!({"input_tokens": 18, "output_tokens": 5, "cache_read_input_tokens": 12,
                "cache_creation_input_tokens": 0})
        );
    }
}
