//! One chat turn in the shape Hugging Face chat templates read: a role and
//! its text, plus the optional tool fields (an assistant's `tool_calls`, a
//! tool result's `tool_call_id` and `name`) and a thinking model's
//! `reasoning_content` (and Gemma 4's in-turn `tool_responses`). Optional fields are left out of the serialized form
//! when unset, so a template sees them undefined, exactly as before they
//! existed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One chat turn, as chat templates expect it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool` or whatever else the template knows.
    pub role: String,
    /// The turn's text.
    pub content: String,
    /// An assistant turn's calls, in the transformers shape
    /// `{"id", "type": "function", "function": {"name", "arguments"}}` with
    /// `arguments` a JSON object (not the string OpenAI's API carries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the name of the function that produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, for templates of thinking models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The results of this turn's calls, `{"name", "response"}` each, for
    /// templates that write them inside the calling turn (Gemma 4's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_responses: Option<Vec<Value>>,
    /// An assistant turn's reasoning where gpt-oss's template reads it
    /// (spec-agent's `template_messages` moves `reasoning_content` here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl Message {
    /// A turn with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
            tool_responses: None,
            thinking: None,
        }
    }

    /// A system turn.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user turn.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant turn.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// An assistant turn that calls tools: `calls` in the transformers shape
    /// (see [`Message::tool_calls`]); `content` is the text before the calls,
    /// often empty.
    pub fn assistant_calls(content: impl Into<String>, calls: Vec<Value>) -> Self {
        Self {
            tool_calls: Some(calls),
            ..Self::assistant(content)
        }
    }

    /// A tool result: `content` answers the call `call_id` of function `name`.
    pub fn tool(
        call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            name: Some(name.into()),
            ..Self::new("tool", content)
        }
    }

    /// This turn with `reasoning` as its reasoning content.
    pub fn with_reasoning(self, reasoning: impl Into<String>) -> Self {
        Self {
            reasoning_content: Some(reasoning.into()),
            ..self
        }
    }
}

/// One call in the transformers shape an assistant turn's `tool_calls` holds:
/// `{"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}`,
/// `arguments` a JSON object.
pub fn tool_call(id: &str, name: &str, arguments: Value) -> Value {
    serde_json::json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_tool_fields_leave_the_serialized_form_unchanged() {
        let json = serde_json::to_string(&Message::user("hi")).expect("serialize");
        assert_eq!(json, r#"{"role":"user","content":"hi"}"#);
        let back: Message = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, Message::user("hi"));
    }

    #[test]
    fn tool_turns_carry_their_fields() {
        let call = tool_call("c1", "get_weather", serde_json::json!({"city": "Paris"}));
        let json = serde_json::to_value(Message::assistant_calls("", vec![call.clone()]))
            .expect("serialize");
        assert_eq!(
            json["tool_calls"][0]["function"]["arguments"]["city"],
            "Paris"
        );
        assert_eq!(json["tool_calls"][0], call);
        let result =
            serde_json::to_value(Message::tool("c1", "get_weather", "sunny")).expect("serialize");
        assert_eq!(
            result,
            serde_json::json!({"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"})
        );
        let thought =
            serde_json::to_value(Message::assistant("4").with_reasoning("2+2")).expect("serialize");
        assert_eq!(thought["reasoning_content"], "2+2");
    }
}
