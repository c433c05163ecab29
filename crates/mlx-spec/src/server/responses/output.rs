//! The Responses API's event machine: the chat pipeline's pieces in,
//! output items and their events out. Reasoning becomes a `reasoning`
//! item (`reasoning_text` content), answer text a `message` item (one
//! `output_text` part, log-probabilities on its deltas when asked for),
//! each call a `function_call` item; each item is announced
//! (`response.output_item.added`), filled by deltas and closed
//! (`..._done` events, then `response.output_item.done`), in order, every
//! event numbered by `sequence_number`. A non-streamed answer is the items
//! this machine ends with, so both shapes come from one mapping.

use serde_json::{json, Value};
use spec_agent::Piece;

pub use crate::server::sse::Named as Event;

#[derive(Debug, Clone, PartialEq)]
enum Body {
    Reasoning(String),
    Message {
        text: String,
        logprobs: Vec<Value>,
    },
    Call {
        call_id: String,
        name: String,
        arguments: String,
        /// The call's index among the response's calls (the parser's).
        index: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    id: String,
    body: Body,
    /// `None` while open; then `completed` or `incomplete`.
    status: Option<&'static str>,
}

impl Item {
    /// The item as the API shows it.
    fn json(&self) -> Value {
        let status = self.status.unwrap_or("in_progress");
        let done = self.status.is_some();
        match &self.body {
            Body::Reasoning(text) => {
                let content: Vec<Value> = if done || !text.is_empty() {
                    vec![json!({"type": "reasoning_text", "text": text})]
                } else {
                    Vec::new()
                };
                json!({"id": self.id, "type": "reasoning", "summary": [], "content": content,
                    "status": status})
            }
            Body::Message { text, logprobs } => {
                let content: Vec<Value> = if done || !text.is_empty() {
                    vec![text_part(text, logprobs)]
                } else {
                    Vec::new()
                };
                json!({"id": self.id, "type": "message", "role": "assistant", "status": status,
                    "content": content})
            }
            Body::Call {
                call_id,
                name,
                arguments,
                ..
            } => json!({"id": self.id, "type": "function_call", "call_id": call_id,
                "name": name, "arguments": arguments, "status": status}),
        }
    }
}

fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

/// Turns pieces into items and events for one response.
#[derive(Debug)]
pub struct Output {
    /// The id's part after `resp_`, which item ids carry.
    suffix: String,
    items: Vec<Item>,
    sequence: u64,
    /// Whitespace-only answer text not yet in an item: dropped when a
    /// call or the end comes next, so no item holds only blank lines.
    held_space: String,
    /// Log-probability entries of tokens whose text has not been sent.
    held_logprobs: Vec<Value>,
}

impl Output {
    /// A machine for the response `response_id` (`resp_...`).
    pub fn new(response_id: &str) -> Self {
        Self {
            suffix: response_id.trim_start_matches("resp_").to_owned(),
            items: Vec::new(),
            sequence: 0,
            held_space: String::new(),
            held_logprobs: Vec::new(),
        }
    }

    /// An event of `kind` with `data`'s fields and the next sequence number.
    pub fn event(&mut self, kind: &'static str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Event { name: kind, data }
    }

    /// Log-probability entries of the tokens whose text comes next.
    pub fn logprobs(&mut self, entries: Vec<Value>) {
        self.held_logprobs.extend(entries);
    }

    /// The events `piece` makes.
    pub fn piece(&mut self, piece: &Piece) -> Vec<Event> {
        let mut out = Vec::new();
        match piece {
            Piece::Reasoning(text) if !text.is_empty() => {
                self.held_space.clear();
                // Reasoning tokens have no place for log-probabilities.
                self.held_logprobs.clear();
                if !matches!(self.open_body(), Some(Body::Reasoning(_))) {
                    self.open(Body::Reasoning(String::new()), &mut out);
                }
                self.reasoning_delta(text, &mut out);
            }
            Piece::Content(text) if !text.is_empty() => {
                if matches!(self.open_body(), Some(Body::Message { .. })) {
                    self.text_delta(text, &mut out);
                } else {
                    self.held_space.push_str(text);
                    if self.held_space.trim().is_empty() {
                        return out;
                    }
                    let held = std::mem::take(&mut self.held_space);
                    // The blank lines after reasoning or a call belong to
                    // no item.
                    let text = if self.items.is_empty() {
                        held
                    } else {
                        held.trim_start().to_owned()
                    };
                    self.open(
                        Body::Message {
                            text: String::new(),
                            logprobs: Vec::new(),
                        },
                        &mut out,
                    );
                    self.text_delta(&text, &mut out);
                }
            }
            Piece::CallStart { index, name } => {
                self.held_space.clear();
                self.held_logprobs.clear();
                let call_id = super::super::openai::call_id();
                self.open(
                    Body::Call {
                        call_id,
                        name: name.clone(),
                        arguments: String::new(),
                        index: *index,
                    },
                    &mut out,
                );
            }
            Piece::CallArguments { index, json } if !json.is_empty() => {
                let open = self.items.last_mut().filter(|i| i.status.is_none());
                match open {
                    Some(Item {
                        id,
                        body:
                            Body::Call {
                                arguments,
                                index: at,
                                ..
                            },
                        ..
                    }) if at == index => {
                        arguments.push_str(json);
                        let (item_id, output_index) = (id.clone(), self.items.len() - 1);
                        let event = self.event(
                            "response.function_call_arguments.delta",
                            json!({"item_id": item_id, "output_index": output_index, "delta": json}),
                        );
                        out.push(event);
                    }
                    _ => {
                        tracing::warn!(index, "arguments for a call that is not open were dropped")
                    }
                }
            }
            Piece::CallEnd { .. } => self.close("completed", &mut out),
            Piece::Reasoning(_) | Piece::Content(_) | Piece::CallArguments { .. } => {}
        }
        out
    }

    /// The end: the open item closed (`incomplete` when the response is),
    /// held log-probabilities sent with an empty delta of the open message.
    pub fn finish(&mut self, complete: bool) -> Vec<Event> {
        let mut out = Vec::new();
        self.held_space.clear();
        if !self.held_logprobs.is_empty() {
            if matches!(self.open_body(), Some(Body::Message { .. })) {
                self.text_delta("", &mut out);
            }
            self.held_logprobs.clear();
        }
        self.close(if complete { "completed" } else { "incomplete" }, &mut out);
        out
    }

    /// The output items as the response lists them.
    pub fn items(&self) -> Vec<Value> {
        self.items.iter().map(Item::json).collect()
    }

    /// The answer's text, reasoning and calls as one assistant message
    /// (what a later turn sends back).
    pub fn message(&self) -> spec_text::Message {
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        for item in &self.items {
            match &item.body {
                Body::Reasoning(r) => reasoning.push_str(r),
                Body::Message { text: t, .. } => text.push_str(t),
                Body::Call {
                    call_id,
                    name,
                    arguments,
                    ..
                } => {
                    // A call cut by `max_output_tokens` has no whole
                    // arguments: it goes back with none.
                    let arguments = serde_json::from_str(arguments).unwrap_or(json!({}));
                    calls.push(spec_text::tool_call(call_id, name, arguments));
                }
            }
        }
        let mut message = if calls.is_empty() {
            spec_text::Message::assistant(text)
        } else {
            spec_text::Message::assistant_calls(text, calls)
        };
        if !reasoning.is_empty() {
            message.reasoning_content = Some(reasoning);
        }
        message
    }

    /// The answer's reasoning text.
    pub fn reasoning(&self) -> String {
        self.items
            .iter()
            .filter_map(|i| match &i.body {
                Body::Reasoning(r) => Some(r.as_str()),
                _ => None,
            })
            .collect()
    }

    fn open_body(&self) -> Option<&Body> {
        self.items
            .last()
            .filter(|i| i.status.is_none())
            .map(|i| &i.body)
    }

    fn open(&mut self, body: Body, out: &mut Vec<Event>) {
        self.close("completed", out);
        let prefix = match body {
            Body::Reasoning(_) => "rs",
            Body::Message { .. } => "msg",
            Body::Call { .. } => "fc",
        };
        let item = Item {
            id: format!("{prefix}_{}_{}", self.suffix, self.items.len()),
            body,
            status: None,
        };
        let output_index = self.items.len();
        let shown = item.json();
        let (id, part) = (item.id.clone(), part_of(&item.body));
        self.items.push(item);
        let added = self.event(
            "response.output_item.added",
            json!({"output_index": output_index, "item": shown}),
        );
        out.push(added);
        if let Some(part) = part {
            let added = self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": output_index, "content_index": 0,
                    "part": part}),
            );
            out.push(added);
        }
    }

    fn reasoning_delta(&mut self, text: &str, out: &mut Vec<Event>) {
        let output_index = self.items.len() - 1;
        let Some(item) = self.items.last_mut() else {
            return;
        };
        if let Body::Reasoning(r) = &mut item.body {
            r.push_str(text);
        }
        let id = item.id.clone();
        let event = self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": text}),
        );
        out.push(event);
    }

    fn text_delta(&mut self, text: &str, out: &mut Vec<Event>) {
        let output_index = self.items.len() - 1;
        let lps = std::mem::take(&mut self.held_logprobs);
        let Some(item) = self.items.last_mut() else {
            return;
        };
        if let Body::Message {
            text: t,
            logprobs: l,
        } = &mut item.body
        {
            t.push_str(text);
            l.extend(lps.iter().cloned());
        }
        let id = item.id.clone();
        let event = self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": output_index, "content_index": 0,
                "delta": text, "logprobs": lps}),
        );
        out.push(event);
    }

    /// Closes the open item, if any: its `..._done` events and
    /// `response.output_item.done` with `status`.
    fn close(&mut self, status: &'static str, out: &mut Vec<Event>) {
        let output_index = self.items.len().saturating_sub(1);
        let Some(item) = self.items.last_mut().filter(|i| i.status.is_none()) else {
            return;
        };
        item.status = Some(status);
        let (id, body, shown) = (item.id.clone(), item.body.clone(), item.json());
        let at = json!({"item_id": id, "output_index": output_index});
        let with = |extra: Value| {
            let mut v = at.clone();
            if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
                v.extend(extra);
            }
            v
        };
        match &body {
            Body::Reasoning(text) => {
                let part = json!({"type": "reasoning_text", "text": text});
                let e = self.event(
                    "response.reasoning_text.done",
                    with(json!({"content_index": 0, "text": text})),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    with(json!({"content_index": 0, "part": part})),
                );
                out.push(e);
            }
            Body::Message { text, logprobs } => {
                let e = self.event(
                    "response.output_text.done",
                    with(json!({"content_index": 0, "text": text, "logprobs": logprobs})),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    with(json!({"content_index": 0, "part": text_part(text, logprobs)})),
                );
                out.push(e);
            }
            Body::Call {
                name, arguments, ..
            } => {
                let e = self.event(
                    "response.function_call_arguments.done",
                    with(json!({"name": name, "arguments": arguments})),
                );
                out.push(e);
            }
        }
        let e = self.event(
            "response.output_item.done",
            json!({"output_index": output_index, "item": shown}),
        );
        out.push(e);
    }
}

/// The empty content part an item opens with, if it has one.
fn part_of(body: &Body) -> Option<Value> {
    match body {
        Body::Reasoning(_) => Some(json!({"type": "reasoning_text", "text": ""})),
        Body::Message { .. } => Some(text_part("", &[])),
        Body::Call { .. } => None,
    }
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
