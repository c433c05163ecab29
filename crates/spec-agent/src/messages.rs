//! Conversations reshaped for templates that place tool results their own
//! way. OpenAI and Anthropic send a result as a `tool` turn after the
//! calling assistant turn; Gemma 4's templates read the results from the
//! calling turn's `tool_responses` and continue that same model turn.
//! gpt-oss's template writes one call per assistant turn (the first; it
//! names each result after the call before it) and reads reasoning from
//! `thinking`.

use serde_json::{json, Value};
use spec_text::Message;

use crate::ToolFormat;

/// `messages` as the template of `format` expects them: for Gemma 4, each
/// run of `tool` turns that follows an assistant turn with calls becomes
/// that turn's `tool_responses` (`{"name", "response"}`, the response the
/// result's JSON object when it is one, its text otherwise); for harmony,
/// see [`harmony_messages`]; for every other format, unchanged.
pub fn template_messages(format: Option<ToolFormat>, messages: &[Message]) -> Vec<Message> {
    match format {
        Some(ToolFormat::Gemma4) => {}
        Some(ToolFormat::Harmony) => return harmony_messages(messages),
        _ => return messages.to_vec(),
    }
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for message in messages {
        let caller = out
            .last_mut()
            .filter(|last| last.role == "assistant" && last.tool_calls.is_some());
        match caller {
            Some(caller) if message.role == "tool" => {
                let name = message
                    .name
                    .clone()
                    .or_else(|| call_name(caller, message.tool_call_id.as_deref()))
                    .unwrap_or_default();
                let response = match serde_json::from_str::<Value>(&message.content) {
                    Ok(object @ Value::Object(_)) => object,
                    _ => Value::from(message.content.as_str()),
                };
                caller
                    .tool_responses
                    .get_or_insert_with(Vec::new)
                    .push(json!({"name": name, "response": response}));
            }
            _ => out.push(message.clone()),
        }
    }
    out
}

/// `messages` for gpt-oss's template: an assistant turn's
/// `reasoning_content` as its `thinking` (a calling turn's text after it,
/// the template taking one or the other); a turn of several calls split
/// into one turn per call, each followed by its own result (matched by
/// call id; results without a match keep their place after the calls).
fn harmony_messages(messages: &[Message]) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    let mut i = 0;
    while i < messages.len() {
        let mut message = messages[i].clone();
        i += 1;
        if message.role == "assistant" && message.thinking.is_none() {
            message.thinking = message.reasoning_content.take();
        }
        // The template writes a calling turn's text as its analysis and
        // refuses a turn with both: the text (a commentary preamble) joins
        // the reasoning after it.
        if message.tool_calls.is_some() && !message.content.is_empty() {
            if let Some(thinking) = message.thinking.as_mut().filter(|t| !t.is_empty()) {
                thinking.push_str("\n\n");
                thinking.push_str(&std::mem::take(&mut message.content));
            }
        }
        let calls = match &message.tool_calls {
            Some(calls) if message.role == "assistant" && calls.len() > 1 => calls.clone(),
            _ => {
                out.push(message);
                continue;
            }
        };
        let end = messages[i..]
            .iter()
            .position(|m| m.role != "tool")
            .map_or(messages.len(), |n| i + n);
        let mut results: Vec<Option<&Message>> = messages[i..end].iter().map(Some).collect();
        for (n, call) in calls.iter().enumerate() {
            let turn = if n == 0 {
                Message {
                    tool_calls: Some(vec![call.clone()]),
                    ..message.clone()
                }
            } else {
                Message::assistant_calls("", vec![call.clone()])
            };
            out.push(turn);
            let id = call["id"].as_str();
            let mine = results
                .iter_mut()
                .find(|r| r.is_some_and(|r| id.is_some() && r.tool_call_id.as_deref() == id))
                .and_then(Option::take);
            out.extend(mine.cloned());
        }
        out.extend(results.into_iter().flatten().cloned());
        i = end;
    }
    out
}

/// The name of the call `id` among `caller`'s calls.
fn call_name(caller: &Message, id: Option<&str>) -> Option<String> {
    let calls = caller.tool_calls.as_ref()?;
    let call = calls.iter().find(|c| c["id"].as_str() == id)?;
    call["function"]["name"].as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use spec_text::tool_call;

    use super::*;

    #[test]
    fn harmony_turns_carry_one_call_each_with_its_result() {
        let messages = vec![
            Message::user("weather and a sum?"),
            Message::assistant_calls(
                "",
                vec![
                    tool_call("c1", "get_weather", json!({"city": "Paris"})),
                    tool_call("c2", "add", json!({"a": 1, "b": 2})),
                ],
            )
            .with_reasoning("Two tools."),
            Message::tool("c2", "add", "3"),
            Message::tool("c1", "get_weather", "sunny"),
            Message::assistant("Sunny; 3.").with_reasoning("Done."),
        ];
        let harmony = template_messages(Some(ToolFormat::Harmony), &messages);
        let shape: Vec<(&str, Option<&str>)> = harmony
            .iter()
            .map(|m| {
                let id = match &m.tool_calls {
                    Some(calls) => calls[0]["id"].as_str(),
                    None => m.tool_call_id.as_deref(),
                };
                (m.role.as_str(), id)
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("user", None),
                ("assistant", Some("c1")),
                ("tool", Some("c1")),
                ("assistant", Some("c2")),
                ("tool", Some("c2")),
                ("assistant", None),
            ]
        );
        assert_eq!(harmony[1].thinking.as_deref(), Some("Two tools."));
        assert_eq!(harmony[1].reasoning_content, None);
        assert_eq!(harmony[3].thinking, None);
        assert_eq!(harmony[5].thinking.as_deref(), Some("Done."));
        // One call per turn already: only the reasoning moves.
        let one = &messages[..2];
        let single = vec![
            messages[0].clone(),
            Message::assistant_calls("", vec![tool_call("c1", "f", json!({}))]),
            Message::tool("c1", "f", "x"),
        ];
        assert_eq!(
            template_messages(Some(ToolFormat::Harmony), &single),
            single
        );
        assert_eq!(template_messages(Some(ToolFormat::Harmony), one).len(), 3);
    }

    #[test]
    fn gemma_results_join_their_calling_turn() {
        let messages = vec![
            Message::user("weather?"),
            Message::assistant_calls(
                "",
                vec![tool_call("c1", "get_weather", json!({"city": "Paris"}))],
            ),
            Message::tool("c1", "get_weather", "sunny"),
            Message {
                name: None,
                ..Message::tool("c1", "", "{\"temp\": 21}")
            },
            Message::user("thanks"),
        ];
        let gemma = template_messages(Some(ToolFormat::Gemma4), &messages);
        assert_eq!(gemma.len(), 3);
        assert_eq!(
            gemma[1].tool_responses,
            Some(vec![
                json!({"name": "get_weather", "response": "sunny"}),
                json!({"name": "get_weather", "response": {"temp": 21}}),
            ])
        );
        assert_eq!(
            template_messages(Some(ToolFormat::Hermes), &messages),
            messages
        );
        // A result with no calling turn stays where it is.
        let orphan = vec![Message::tool("c9", "f", "x")];
        assert_eq!(template_messages(Some(ToolFormat::Gemma4), &orphan), orphan);
    }
}
