//! Conversations reshaped for templates that place tool results their own
//! way. OpenAI and Anthropic send a result as a `tool` turn after the
//! calling assistant turn; Gemma 4's templates read the results from the
//! calling turn's `tool_responses` and continue that same model turn.

use serde_json::{json, Value};
use spec_text::Message;

use crate::ToolFormat;

/// `messages` as the template of `format` expects them: for Gemma 4, each
/// run of `tool` turns that follows an assistant turn with calls becomes
/// that turn's `tool_responses` (`{"name", "response"}`, the response the
/// result's JSON object when it is one, its text otherwise); for every
/// other format, unchanged.
pub fn template_messages(format: Option<ToolFormat>, messages: &[Message]) -> Vec<Message> {
    if format != Some(ToolFormat::Gemma4) {
        return messages.to_vec();
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
