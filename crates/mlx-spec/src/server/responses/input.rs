//! The Responses API's `input` turned into template messages: a string is
//! one user message; a list holds message items (`input_text` parts, an
//! assistant's `output_text`), `function_call` items (joined to the
//! assistant message before them, as one turn with calls),
//! `function_call_output` items (tool messages answering an earlier call)
//! and `reasoning` items (the next assistant turn's reasoning). Each
//! problem is a 400 naming the item and field.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use spec_text::Message;

use crate::server::api::ApiError;

fn bad(message: String) -> ApiError {
    ApiError::invalid(message, Some("input"))
}

/// The messages of `input`, after `history` (a stored conversation, whose
/// calls later items may answer).
pub fn messages(input: Option<&Value>, history: &[Message]) -> Result<Vec<Message>, ApiError> {
    let mut reader = Reader::default();
    for m in history {
        for call in m.tool_calls.iter().flatten() {
            reader.note_call(call);
        }
    }
    match input {
        None | Some(Value::Null) => Err(bad("`input` is required".to_owned())),
        Some(Value::String(text)) => Ok(vec![Message::user(text.clone())]),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(bad("`input` must not be an empty list".to_owned()))
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                reader.item(i, item)?;
            }
            Ok(reader.out)
        }
        Some(_) => Err(bad("`input` must be a string or a list of items".to_owned())),
    }
}

#[derive(Default)]
struct Reader {
    out: Vec<Message>,
    /// Call id -> function name, of the calls so far.
    calls: BTreeMap<String, String>,
    /// A `reasoning` item's text, for the assistant turn that follows.
    reasoning: Option<String>,
}

impl Reader {
    fn note_call(&mut self, call: &Value) {
        let id = call.get("id").and_then(Value::as_str);
        let name = call
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        if let (Some(id), Some(name)) = (id, name) {
            self.calls.insert(id.to_owned(), name.to_owned());
        }
    }

    fn item(&mut self, i: usize, item: &Value) -> Result<(), ApiError> {
        let Some(obj) = item.as_object() else {
            return Err(bad(format!("`input[{i}]` must be an object")));
        };
        let kind = match obj.get("type") {
            None | Some(Value::Null) if obj.contains_key("role") => "message",
            Some(Value::String(kind)) => kind.as_str(),
            _ => {
                return Err(bad(format!(
                    "`input[{i}].type` is required (message, function_call, function_call_output or reasoning)"
                )))
            }
        };
        match kind {
            "message" => self.message(i, obj),
            "function_call" => self.call(i, obj),
            "function_call_output" => self.output(i, obj),
            "reasoning" => {
                self.reasoning = Some(reasoning_text(i, obj)?);
                Ok(())
            }
            "item_reference" => Err(bad(format!(
                "`input[{i}]`: `item_reference` is not supported; send the item itself, or continue with `previous_response_id`"
            ))),
            other => Err(bad(format!(
                "`input[{i}].type`: unsupported item type `{other}` (message, function_call, function_call_output or reasoning)"
            ))),
        }
    }

    fn message(&mut self, i: usize, obj: &Map<String, Value>) -> Result<(), ApiError> {
        let role = match obj.get("role").and_then(Value::as_str) {
            Some(role @ ("user" | "system" | "assistant")) => role,
            Some("developer") => "system",
            Some(other) => {
                return Err(bad(format!(
                    "`input[{i}].role`: unsupported role `{other}` (user, system, developer or assistant)"
                )))
            }
            None => return Err(bad(format!("`input[{i}].role` must be a string"))),
        };
        let text = content_text(obj.get("content"), &format!("input[{i}].content"))?;
        let mut message = Message::new(role, text);
        if role == "assistant" {
            message.reasoning_content = self.reasoning.take();
        } else {
            self.reasoning = None;
        }
        self.out.push(message);
        Ok(())
    }

    fn call(&mut self, i: usize, obj: &Map<String, Value>) -> Result<(), ApiError> {
        let field = |name: &str| match obj.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(bad(format!(
                "`input[{i}].{name}` must be a non-empty string"
            ))),
        };
        let (call_id, name) = (field("call_id")?, field("name")?);
        let arguments = match obj.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                .map_err(|e| bad(format!("`input[{i}].arguments` is not JSON ({e})")))?,
            _ => {
                return Err(bad(format!(
                    "`input[{i}].arguments` must be a string of JSON"
                )))
            }
        };
        if !arguments.is_object() {
            return Err(bad(format!("`input[{i}].arguments` must be a JSON object")));
        }
        let call = spec_text::tool_call(&call_id, &name, arguments);
        self.calls.insert(call_id, name);
        // A call joins the assistant turn it follows (its text or its
        // other calls), else opens one.
        match self.out.last_mut() {
            Some(last) if last.role == "assistant" => {
                last.tool_calls.get_or_insert_with(Vec::new).push(call);
                if let Some(r) = self.reasoning.take() {
                    last.reasoning_content = Some(r);
                }
            }
            _ => {
                let mut message = Message::assistant_calls(String::new(), vec![call]);
                message.reasoning_content = self.reasoning.take();
                self.out.push(message);
            }
        }
        Ok(())
    }

    fn output(&mut self, i: usize, obj: &Map<String, Value>) -> Result<(), ApiError> {
        let call_id = match obj.get("call_id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(bad(format!(
                    "`input[{i}].call_id` must be a non-empty string"
                )))
            }
        };
        let Some(name) = self.calls.get(&call_id).cloned() else {
            return Err(bad(format!(
                "`input[{i}].call_id` `{call_id}` answers no earlier function_call"
            )));
        };
        let output = content_text(obj.get("output"), &format!("input[{i}].output"))?;
        self.reasoning = None;
        self.out.push(Message::tool(call_id, name, output));
        Ok(())
    }
}

/// A message's or an output's content: a string, or text parts
/// (`input_text`, `output_text`, `refusal`).
fn content_text(field: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match field {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                let body = match kind {
                    "input_text" | "output_text" => part.get("text"),
                    "refusal" => part.get("refusal"),
                    "input_image" | "input_file" | "input_audio" => {
                        return Err(bad(format!(
                            "`{at}[{j}]`: `{kind}` is not supported by this text-only server"
                        )))
                    }
                    other => {
                        return Err(bad(format!(
                            "`{at}[{j}].type`: unsupported content part `{other}` (input_text, output_text or refusal)"
                        )))
                    }
                };
                match body {
                    Some(Value::String(s)) => text.push_str(s),
                    _ => return Err(bad(format!("`{at}[{j}]` has no text"))),
                }
            }
            Ok(text)
        }
        _ => Err(bad(format!("`{at}` must be a string or a list of parts"))),
    }
}

/// A `reasoning` item's text: its `content` (`reasoning_text` parts), or
/// its `summary` (`summary_text` parts) when it has none.
fn reasoning_text(i: usize, obj: &Map<String, Value>) -> Result<String, ApiError> {
    let parts = |name: &str| -> Result<Option<String>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Option<Vec<_>>>()
                .map(|t| Some(t.concat()))
                .ok_or_else(|| bad(format!("`input[{i}].{name}` parts must each have `text`"))),
            Some(_) => Err(bad(format!("`input[{i}].{name}` must be a list"))),
        }
    };
    let content = parts("content")?.filter(|t| !t.is_empty());
    Ok(match content {
        Some(text) => text,
        None => parts("summary")?.unwrap_or_default(),
    })
}

/// `input` (checked by [`messages`]) as `GET .../input_items` lists it:
/// a string as a user message item, each message's string content as a
/// text part, every item with a `type`, a `status` and an id (its own, or
/// `msg_` / `fc_` / `fco_` / `rs_` with the response's id and its place).
pub fn items(input: &Value, response_id: &str) -> Vec<Value> {
    let suffix = response_id.trim_start_matches("resp_");
    let listed: Vec<Value> = match input {
        Value::String(text) => vec![serde_json::json!({"role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    listed
        .into_iter()
        .enumerate()
        .map(|(n, mut item)| {
            let Some(obj) = item.as_object_mut() else {
                return item;
            };
            let kind = obj
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("message")
                .to_owned();
            obj.insert("type".into(), Value::String(kind.clone()));
            if kind == "message" {
                let role = obj.get("role").and_then(Value::as_str).unwrap_or("user");
                let part = if role == "assistant" {
                    "output_text"
                } else {
                    "input_text"
                };
                if let Some(Value::String(text)) = obj.get("content") {
                    let parts = serde_json::json!([{"type": part, "text": text}]);
                    obj.insert("content".into(), parts);
                }
            }
            let prefix = match kind.as_str() {
                "function_call" => "fc",
                "function_call_output" => "fco",
                "reasoning" => "rs",
                _ => "msg",
            };
            if !obj.get("id").is_some_and(Value::is_string) {
                obj.insert("id".into(), format!("{prefix}_{suffix}_in{n}").into());
            }
            obj.entry("status")
                .or_insert_with(|| Value::String("completed".into()));
            item
        })
        .collect()
}

#[cfg(test)]
#[path = "input_tests.rs"]
mod tests;
