//! Chat Completions' messages as sent (text or text parts, an assistant's
//! `tool_calls` with JSON-string arguments, `tool` results) turned into the
//! template's messages; each problem a 400 naming the message and field.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use spec_text::Message;

use crate::server::api::ApiError;

fn bad(message: String) -> ApiError {
    ApiError::invalid(message, Some("messages"))
}

/// One message as sent.
#[derive(Debug, Deserialize, Clone)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant's calls: `[{"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}]`.
    pub tool_calls: Option<Value>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<Value>,
    /// An assistant's reasoning (thinking models' templates render it).
    pub reasoning_content: Option<String>,
}

/// Message content: text, or a list of text parts.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

fn text(content: Option<&Content>, i: usize) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(bad(format!("`messages[{i}].content[{j}]`: unsupported content part `{kind}` (text only)")))
                    }
                }
            }
            Ok(text)
        }
    }
}

/// An assistant's `tool_calls` in the template's shape (arguments parsed
/// into objects); records each call's id and name in `calls`.
fn assistant_calls(
    field: &Value,
    i: usize,
    calls: &mut BTreeMap<String, String>,
) -> Result<Vec<Value>, ApiError> {
    let Value::Array(list) = field else {
        return Err(bad(format!("`messages[{i}].tool_calls` must be a list")));
    };
    list.iter()
        .enumerate()
        .map(|(j, call)| {
            let at = |field: &str| format!("messages[{i}].tool_calls[{j}]{field}");
            let id = match call.get("id") {
                Some(Value::String(id)) if !id.is_empty() => id.clone(),
                _ => return Err(bad(format!("`{}` must be a non-empty string", at(".id")))),
            };
            let function = call.get("function");
            let name = match function.and_then(|f| f.get("name")) {
                Some(Value::String(n)) if !n.is_empty() => n.clone(),
                _ => {
                    return Err(bad(format!(
                        "`{}` must be a non-empty string",
                        at(".function.name")
                    )))
                }
            };
            let arguments = match function.and_then(|f| f.get("arguments")) {
                Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                    bad(format!(
                        "`{}` is not JSON ({e}): {}",
                        at(".function.arguments"),
                        preview(s)
                    ))
                })?,
                Some(object @ Value::Object(_)) => object.clone(),
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(_) => {
                    return Err(bad(format!(
                        "`{}` must be a JSON string",
                        at(".function.arguments")
                    )))
                }
            };
            if !arguments.is_object() {
                return Err(bad(format!(
                    "`{}` must be a JSON object",
                    at(".function.arguments")
                )));
            }
            calls.insert(id.clone(), name.clone());
            Ok(spec_text::tool_call(&id, &name, arguments))
        })
        .collect()
}

/// The start of a long value, for messages.
fn preview(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    if cut.len() < s.len() {
        format!("`{cut}`...")
    } else {
        format!("`{cut}`")
    }
}

/// The messages in the template's shape: `developer` is `system`, tool
/// results carry the name of the call they answer (which must come before
/// them).
pub fn messages(sent: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if sent.is_empty() {
        return Err(bad("`messages` must not be empty".to_owned()));
    }
    // Call id -> function name, of the assistant calls so far.
    let mut calls = BTreeMap::new();
    sent.iter()
        .enumerate()
        .map(|(i, m)| {
            let content = text(m.content.as_ref(), i)?;
            match m.role.as_str() {
                "system" | "developer" | "user" => {
                    let role = if m.role == "developer" { "system" } else { m.role.as_str() };
                    Ok(Message::new(role, content))
                }
                "assistant" => {
                    let mut message = match &m.tool_calls {
                        None | Some(Value::Null) => Message::assistant(content),
                        Some(field) => Message::assistant_calls(
                            content,
                            assistant_calls(field, i, &mut calls)?,
                        ),
                    };
                    message.reasoning_content = m.reasoning_content.clone();
                    Ok(message)
                }
                "tool" => {
                    let id = match &m.tool_call_id {
                        Some(Value::String(id)) if !id.is_empty() => id,
                        _ => {
                            return Err(bad(format!("`messages[{i}].tool_call_id` is required in a `tool` message (the id of the call it answers)")))
                        }
                    };
                    let name = calls.get(id).ok_or_else(|| {
                        bad(format!("`messages[{i}].tool_call_id` `{id}` answers no call of an earlier assistant message"))
                    })?;
                    Ok(Message::tool(id.clone(), name.clone(), content))
                }
                other => Err(bad(format!("`messages[{i}].role`: unsupported role `{other}`"))),
            }
        })
        .collect()
}
