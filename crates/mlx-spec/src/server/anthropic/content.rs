//! `messages` and `system` of a Messages request into the chat template's
//! messages: text blocks join into one message's text, `tool_use` blocks
//! become the assistant message's `tool_calls`, each `tool_result` block a
//! `tool` message carrying its `tool_use_id`, `thinking` blocks the
//! assistant's `reasoning_content`; the blocks of a turn keep their order.
//! Every refusal names the block's path (`messages[2].content[0].type`).

use std::collections::HashMap;

use serde_json::{json, Value};
use spec_text::Message;

use crate::server::api::ApiError;

/// A 400 naming `path` (under the request's field `param`).
pub(super) fn invalid(param: &'static str, path: &str, message: &str) -> ApiError {
    ApiError::invalid(format!("{path}: {message}"), Some(param))
}

/// Text blocks' texts join with a blank line, as separate paragraphs.
const JOIN: &str = "\n\n";

/// `system`: a string or a list of text blocks; `None` when absent or
/// empty.
pub fn system(field: Option<&Value>) -> Result<Option<String>, ApiError> {
    match field {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok((!s.is_empty()).then(|| s.clone())),
        Some(Value::Array(blocks)) => {
            let text = text_blocks(blocks, "system", "system")?;
            Ok((!text.is_empty()).then_some(text))
        }
        Some(_) => Err(invalid(
            "system",
            "system",
            "must be a string or a list of text blocks",
        )),
    }
}

/// The texts of a list that may hold only text blocks.
fn text_blocks(blocks: &[Value], param: &'static str, path: &str) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let path = format!("{path}[{j}]");
        match block_type(block, param, &path)? {
            "text" => texts.push(text_of(block, param, &path)?),
            other => {
                return Err(invalid(
                    param,
                    &format!("{path}.type"),
                    &format!("`{other}` blocks are not supported here (text only)"),
                ))
            }
        }
    }
    Ok(texts.join(JOIN))
}

fn block_type<'a>(block: &'a Value, param: &'static str, path: &str) -> Result<&'a str, ApiError> {
    if !block.is_object() {
        return Err(invalid(param, path, "a content block must be an object"));
    }
    block
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(param, &format!("{path}.type"), "field required (a string)"))
}

fn string_field(
    block: &Value,
    key: &str,
    param: &'static str,
    path: &str,
) -> Result<String, ApiError> {
    block
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| invalid(param, &format!("{path}.{key}"), "field required (a string)"))
}

fn text_of(block: &Value, param: &'static str, path: &str) -> Result<String, ApiError> {
    string_field(block, "text", param, path)
}

/// A message's `content`: a string stands for one text block.
fn blocks_of(message: &Value, path: &str) -> Result<Vec<Value>, ApiError> {
    match message.get("content") {
        Some(Value::String(s)) => Ok(vec![json!({"type": "text", "text": s})]),
        Some(Value::Array(blocks)) => Ok(blocks.clone()),
        Some(_) => Err(invalid(
            "messages",
            &format!("{path}.content"),
            "must be a string or a list of content blocks",
        )),
        None => Err(invalid(
            "messages",
            &format!("{path}.content"),
            "field required",
        )),
    }
}

/// The block types a turn may hold, for messages.
const KNOWN: &str = "text, tool_use, tool_result, thinking, redacted_thinking";

fn unsupported(path: &str, kind: &str, role: &str) -> ApiError {
    let message = if [
        "text",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
    ]
    .contains(&kind)
    {
        format!("a `{kind}` block cannot be in a `{role}` turn")
    } else {
        format!("unknown or unsupported content block type `{kind}` (this server takes {KNOWN})")
    };
    invalid("messages", &format!("{path}.type"), &message)
}

/// The chat messages of `messages`, after the `system` text (when any).
pub fn messages(field: Option<&Value>, system: Option<String>) -> Result<Vec<Message>, ApiError> {
    let list = match field {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => {
            return Err(invalid(
                "messages",
                "messages",
                "must hold at least one message",
            ))
        }
        Some(_) => {
            return Err(invalid(
                "messages",
                "messages",
                "must be a list of messages",
            ))
        }
        None => return Err(invalid("messages", "messages", "field required")),
    };
    let mut out: Vec<Message> = system.into_iter().map(Message::system).collect();
    // The tool_use blocks seen so far: id -> the tool's name.
    let mut calls: HashMap<String, String> = HashMap::new();
    for (i, message) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        let role = message.get("role").and_then(Value::as_str).ok_or_else(|| {
            invalid(
                "messages",
                &format!("{path}.role"),
                "field required (user or assistant)",
            )
        })?;
        let blocks = blocks_of(message, &path)?;
        let path = format!("{path}.content");
        match role {
            "user" => user_turn(&blocks, &path, &calls, &mut out)?,
            "assistant" => out.push(assistant_turn(&blocks, &path, &mut calls)?),
            "system" => out.push(Message::system(text_blocks(&blocks, "messages", &path)?)),
            other => {
                return Err(invalid(
                    "messages",
                    &format!("messages[{i}].role"),
                    &format!("unknown role `{other}` (user or assistant)"),
                ))
            }
        }
    }
    Ok(out)
}

/// A user turn: its text, and a `tool` message per `tool_result`, in order.
fn user_turn(
    blocks: &[Value],
    path: &str,
    calls: &HashMap<String, String>,
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    let mut texts: Vec<String> = Vec::new();
    let mut any_result = false;
    for (j, block) in blocks.iter().enumerate() {
        let path = format!("{path}[{j}]");
        match block_type(block, "messages", &path)? {
            "text" => texts.push(text_of(block, "messages", &path)?),
            "tool_result" => {
                if !texts.is_empty() {
                    out.push(Message::user(texts.join(JOIN)));
                    texts.clear();
                }
                out.push(tool_result(block, &path, calls)?);
                any_result = true;
            }
            "redacted_thinking" => {}
            other => return Err(unsupported(&path, other, "user")),
        }
    }
    if !texts.is_empty() || !any_result {
        out.push(Message::user(texts.join(JOIN)));
    }
    Ok(())
}

fn tool_result(
    block: &Value,
    path: &str,
    calls: &HashMap<String, String>,
) -> Result<Message, ApiError> {
    let id = string_field(block, "tool_use_id", "messages", path)?;
    let Some(name) = calls.get(&id) else {
        return Err(invalid(
            "messages",
            &format!("{path}.tool_use_id"),
            &format!("`{id}` answers no `tool_use` block of an earlier assistant turn"),
        ));
    };
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => text_blocks(blocks, "messages", &format!("{path}.content"))?,
        Some(_) => {
            return Err(invalid(
                "messages",
                &format!("{path}.content"),
                "must be a string or a list of text blocks",
            ))
        }
    };
    let is_error = match block.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(invalid(
                "messages",
                &format!("{path}.is_error"),
                "must be a boolean",
            ))
        }
    };
    // Templates have no place for the flag: the model reads it in the text.
    let content = if is_error {
        format!("Error: {content}")
    } else {
        content
    };
    Ok(Message::tool(id, name.clone(), content))
}

/// An assistant turn: one message with its text, reasoning and calls.
fn assistant_turn(
    blocks: &[Value],
    path: &str,
    calls: &mut HashMap<String, String>,
) -> Result<Message, ApiError> {
    let mut texts: Vec<String> = Vec::new();
    let mut thinking: Vec<String> = Vec::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let path = format!("{path}[{j}]");
        match block_type(block, "messages", &path)? {
            "text" => texts.push(text_of(block, "messages", &path)?),
            "thinking" => thinking.push(string_field(block, "thinking", "messages", &path)?),
            "redacted_thinking" => {}
            "tool_use" => {
                let id = string_field(block, "id", "messages", &path)?;
                let name = string_field(block, "name", "messages", &path)?;
                if id.is_empty() || calls.contains_key(&id) {
                    return Err(invalid(
                        "messages",
                        &format!("{path}.id"),
                        &format!("`{id}` is empty or repeats an earlier tool_use id"),
                    ));
                }
                let input = match block.get("input") {
                    Some(Value::Object(input)) => input.clone(),
                    _ => {
                        return Err(invalid(
                            "messages",
                            &format!("{path}.input"),
                            "field required (a JSON object)",
                        ))
                    }
                };
                tool_calls.push(spec_text::tool_call(&id, &name, Value::Object(input)));
                calls.insert(id, name);
            }
            other => return Err(unsupported(&path, other, "assistant")),
        }
    }
    let message = if tool_calls.is_empty() {
        Message::assistant(texts.join(JOIN))
    } else {
        Message::assistant_calls(texts.join(JOIN), tool_calls)
    };
    Ok(if thinking.is_empty() {
        message
    } else {
        message.with_reasoning(thinking.join(JOIN))
    })
}

#[cfg(test)]
#[path = "content_tests.rs"]
mod tests;
