//! The Messages API's event machine: the chat pipeline's pieces
//! (reasoning, content, tool calls) in, Anthropic's named events out
//! (`message_start`, `ping`, `content_block_start` / `_delta` / `_stop` with
//! block indices from 0 in order, `message_delta`, `message_stop`). A
//! non-streamed answer is these events accumulated ([`super::response`]),
//! so both shapes come from this one mapping.

use serde_json::{json, Value};
use spec_agent::Piece;

use crate::server::api::ApiError;

pub use crate::server::sse::Named as Event;

/// An `error` event carrying `e` in Anthropic's shape (mid-stream
/// failures: the status line went out already).
pub fn error_event(e: &ApiError) -> Event {
    Event::new("error", super::errors::body(e))
}

/// Why generation ended, as Anthropic says it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: &'static str,
    /// The stop sequence that ended it, with `stop_sequence`.
    pub stop_sequence: Option<String>,
}

impl Ending {
    /// From the engine's finish reason (`stop` or `length`), the stop
    /// sequence that matched (when one did) and whether a tool was called.
    pub fn new(finish_reason: &str, stop_sequence: Option<String>, called: bool) -> Self {
        let stop_reason = match (finish_reason, &stop_sequence) {
            ("length", _) => "max_tokens",
            _ if called => "tool_use",
            (_, Some(_)) => "stop_sequence",
            _ => "end_turn",
        };
        Self {
            stop_sequence: stop_sequence.filter(|_| stop_reason == "stop_sequence"),
            stop_reason,
        }
    }
}

/// The block open now.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Text,
    Thinking,
    /// A tool_use block for the call of this index.
    Call(usize),
}

/// Turns pieces into events for one message.
#[derive(Debug)]
pub struct Events {
    message_id: String,
    open: Option<(Open, usize)>,
    next_index: usize,
    called: bool,
    /// Whitespace-only content not yet in a block: dropped when a call
    /// or the end comes next, so calls are not split by empty text blocks.
    held_space: String,
}

impl Events {
    /// A machine for the message `message_id` (`msg_...`).
    pub fn new(message_id: &str) -> Self {
        Self {
            message_id: message_id.to_owned(),
            open: None,
            next_index: 0,
            called: false,
            held_space: String::new(),
        }
    }

    /// Whether a tool_use block has started.
    pub fn called(&self) -> bool {
        self.called
    }

    /// The id of the message's call `index`: unique, as clients send it
    /// back in their `tool_result`.
    pub fn tool_use_id(&self, index: usize) -> String {
        let suffix = self.message_id.trim_start_matches("msg_");
        format!("toolu_{suffix}_{index}")
    }

    /// `message_start` (the message with no content yet) and a `ping`.
    pub fn start(&self, model: &str, usage: Value) -> Vec<Event> {
        let message = json!({"id": self.message_id, "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage});
        vec![
            Event::new(
                "message_start",
                json!({"type": "message_start", "message": message}),
            ),
            Event::new("ping", json!({"type": "ping"})),
        ]
    }

    /// The events `piece` makes.
    pub fn piece(&mut self, piece: &Piece) -> Vec<Event> {
        let mut out = Vec::new();
        match piece {
            Piece::Reasoning(text) if !text.is_empty() => {
                self.held_space.clear();
                self.ensure_open(Open::Thinking, &mut out);
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": text})));
            }
            Piece::Content(text) if !text.is_empty() => {
                if self.current() != Some(Open::Text) {
                    self.held_space.push_str(text);
                    if self.held_space.trim().is_empty() {
                        return out;
                    }
                    let held = std::mem::take(&mut self.held_space);
                    // The blank lines a model writes after its reasoning
                    // (`</think>\n\n`) or a call belong to no block.
                    let text = if self.next_index > 0 {
                        held.trim_start().to_owned()
                    } else {
                        held
                    };
                    self.ensure_open(Open::Text, &mut out);
                    out.push(self.delta(json!({"type": "text_delta", "text": text})));
                } else {
                    out.push(self.delta(json!({"type": "text_delta", "text": text})));
                }
            }
            Piece::CallStart { index, name } => {
                self.held_space.clear();
                self.close(&mut out);
                self.called = true;
                let block = json!({"type": "tool_use", "id": self.tool_use_id(*index),
                    "name": name, "input": {}});
                self.open_block(Open::Call(*index), block, &mut out);
            }
            Piece::CallArguments { index, json } => {
                if self.current() == Some(Open::Call(*index)) && !json.is_empty() {
                    out.push(self.delta(json!({"type": "input_json_delta", "partial_json": json})));
                } else if !json.is_empty() {
                    tracing::warn!(index, "arguments for a call that is not open were dropped");
                }
            }
            Piece::CallEnd { index } => {
                if self.current() == Some(Open::Call(*index)) {
                    self.close(&mut out);
                }
            }
            Piece::Reasoning(_) | Piece::Content(_) => {}
        }
        out
    }

    /// The end: the open block's stop, `message_delta` with the stop
    /// reason and the usage, `message_stop`.
    pub fn finish(&mut self, ending: &Ending, usage: Value) -> Vec<Event> {
        let mut out = Vec::new();
        self.held_space.clear();
        self.close(&mut out);
        out.push(Event::new(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": ending.stop_reason, "stop_sequence": ending.stop_sequence},
                "usage": usage}),
        ));
        out.push(Event::new("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn current(&self) -> Option<Open> {
        self.open.map(|(kind, _)| kind)
    }

    fn ensure_open(&mut self, kind: Open, out: &mut Vec<Event>) {
        if self.current() == Some(kind) {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.open_block(kind, block, out);
    }

    fn open_block(&mut self, kind: Open, block: Value, out: &mut Vec<Event>) {
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((kind, index));
        out.push(Event::new(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
    }

    fn delta(&self, delta: Value) -> Event {
        let index = self.open.map(|(_, i)| i).unwrap_or(0);
        Event::new(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((_, index)) = self.open.take() {
            out.push(Event::new(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
