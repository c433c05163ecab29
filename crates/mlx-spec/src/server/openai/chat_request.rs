//! Chat Completions' request: its messages (see `chat_messages`),
//! `tools`, `tool_choice`, `parallel_tool_calls` and
//! `chat_template_kwargs`, checked and turned into a [`ChatTurn`]. Every
//! problem is a 400 naming the field (`tools[1].function.parameters`)
//! before anything is queued.

use serde::Deserialize;
use serde_json::{Map, Value};
use spec_agent::{Tool, ToolChoice};

use super::chat_messages::{messages, ChatMessage};
use crate::server::api::{ApiError, Common};
use crate::server::chat_turn::{agent_error, ChatTurn};

/// The body of `POST /v1/chat/completions`.
#[derive(Debug, Deserialize, Clone)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// A boolean: report each token's log-probability.
    pub logprobs: Option<Value>,
    /// 0 to 20 alternatives per token (with `logprobs: true`).
    pub top_logprobs: Option<Value>,
    /// `[{"type": "function", "function": {"name", "description", "parameters"}}]`.
    pub tools: Option<Value>,
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    /// Whether one answer may hold several calls (default true).
    pub parallel_tool_calls: Option<Value>,
    /// Extra variables for the chat template (e.g. `enable_thinking`).
    pub chat_template_kwargs: Option<Value>,
    /// `"low"`, `"medium"` or `"high"`: passed to the template as the
    /// variable `reasoning_effort` (templates that know it read it).
    pub reasoning_effort: Option<Value>,
    #[serde(flatten)]
    pub common: Common,
}

fn bad(message: String, param: &'static str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

impl ChatRequest {
    /// The turn this request asks for, everything checked.
    pub fn turn(&self, logprobs: Option<usize>) -> Result<ChatTurn, ApiError> {
        let tools = tools(self.tools.as_ref())?;
        let tool_choice = tool_choice(self.tool_choice.as_ref(), &tools)?;
        let parallel_tool_calls = match &self.parallel_tool_calls {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(bad(
                    "`parallel_tool_calls` must be a boolean".to_owned(),
                    "parallel_tool_calls",
                ))
            }
        };
        let mut template_kwargs = match &self.chat_template_kwargs {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => {
                return Err(bad(
                    "`chat_template_kwargs` must be an object of template variables".to_owned(),
                    "chat_template_kwargs",
                ))
            }
        };
        match &self.reasoning_effort {
            None | Some(Value::Null) => {}
            Some(Value::String(e)) if ["low", "medium", "high"].contains(&e.as_str()) => {
                template_kwargs
                    .entry("reasoning_effort")
                    .or_insert_with(|| Value::String(e.clone()));
            }
            Some(other) => {
                return Err(bad(
                    format!(
                        "`reasoning_effort` must be \"low\", \"medium\" or \"high\", got {other}"
                    ),
                    "reasoning_effort",
                ))
            }
        }
        Ok(ChatTurn {
            tools,
            tool_choice,
            parallel_tool_calls,
            template_kwargs,
            logprobs,
            ..ChatTurn::new(messages(&self.messages)?)
        })
    }
}

/// Where a tool's fields sit: Chat Completions nests them under
/// `function`, the Responses API puts them on the tool itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolShape {
    Chat,
    Responses,
}

impl ToolShape {
    /// The path of a function field, for messages.
    fn path(self, field: &str) -> String {
        match self {
            Self::Chat => format!(".function.{field}"),
            Self::Responses => format!(".{field}"),
        }
    }
}

/// `tools` of Chat Completions.
pub fn tools(field: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    tools_of(field, ToolShape::Chat)
}

/// `tools`: a list of functions, each with a unique valid name and a JSON
/// schema object for its parameters (absent: no parameters); the rules of
/// names and schemas are `spec_agent::check_tools`'.
pub fn tools_of(field: Option<&Value>, shape: ToolShape) -> Result<Vec<Tool>, ApiError> {
    let list = match field {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => {
            let form = match shape {
                ToolShape::Chat => "`{\"type\": \"function\", \"function\": {...}}`",
                ToolShape::Responses => "`{\"type\": \"function\", \"name\": ...}`",
            };
            return Err(bad(format!("`tools` must be a list of {form}"), "tools"));
        }
    };
    let tools = list
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let at = |field: &str| format!("tools[{i}]{field}");
            let kind = item.get("type").and_then(Value::as_str);
            if kind != Some("function") {
                let only = match (shape, kind) {
                    (ToolShape::Responses, Some(other)) => format!(
                        "`{}` must be \"function\" (`{other}` tools run on OpenAI's servers, not here)",
                        at(".type")
                    ),
                    _ => format!("`{}` must be \"function\"", at(".type")),
                };
                return Err(bad(only, "tools"));
            }
            let function = match shape {
                ToolShape::Chat => item.get("function").and_then(Value::as_object),
                ToolShape::Responses => item.as_object(),
            };
            let Some(function) = function else {
                return Err(bad(
                    format!("`{}` must be an object", at(".function")),
                    "tools",
                ));
            };
            let name = match function.get("name") {
                Some(Value::String(n)) => n.clone(),
                _ => {
                    return Err(bad(
                        format!("`{}` must be a string", at(&shape.path("name"))),
                        "tools",
                    ))
                }
            };
            let description = match function.get("description") {
                None | Some(Value::Null) => None,
                Some(Value::String(d)) => Some(d.clone()),
                Some(_) => {
                    return Err(bad(
                        format!("`{}` must be a string", at(&shape.path("description"))),
                        "tools",
                    ))
                }
            };
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => {
                    serde_json::json!({"type": "object", "properties": {}})
                }
                Some(schema @ Value::Object(_)) => schema.clone(),
                Some(_) => {
                    return Err(bad(
                        format!(
                            "`{}` must be a JSON Schema object",
                            at(&shape.path("parameters"))
                        ),
                        "tools",
                    ))
                }
            };
            Ok(Tool {
                name,
                description,
                parameters,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Names (their characters, no two alike) and schemas' shape.
    spec_agent::check_tools(&tools).map_err(|e| {
        let mut e = agent_error(&e);
        if shape == ToolShape::Responses {
            e.message = e.message.replace(".function.", ".");
        }
        e
    })?;
    Ok(tools)
}

/// `tool_choice`, checked against the tools: a named function must be one
/// of them; `required` and a name need tools.
pub fn tool_choice(field: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    tool_choice_of(field, tools, ToolShape::Chat)
}

/// `tool_choice` in either API's shape (a named function is
/// `{"type": "function", "function": {"name"}}` in Chat Completions,
/// `{"type": "function", "name"}` in the Responses API).
pub fn tool_choice_of(
    field: Option<&Value>,
    tools: &[Tool],
    shape: ToolShape,
) -> Result<ToolChoice, ApiError> {
    let choice = match field {
        None | Some(Value::Null) => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    format!("`tool_choice` must be \"auto\", \"none\", \"required\" or a function, got \"{other}\""),
                    "tool_choice",
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = match shape {
                ToolShape::Chat => o.get("function").and_then(|f| f.get("name")),
                ToolShape::Responses => o.get("name"),
            };
            match (o.get("type").and_then(Value::as_str), name.and_then(Value::as_str)) {
                (Some("function"), Some(name)) => ToolChoice::Named(name.to_owned()),
                _ => {
                    let form = match shape {
                        ToolShape::Chat => "`{\"type\": \"function\", \"function\": {\"name\": ...}}`",
                        ToolShape::Responses => "`{\"type\": \"function\", \"name\": ...}`",
                    };
                    return Err(bad(
                        format!("`tool_choice` as an object must be {form}"),
                        "tool_choice",
                    ));
                }
            }
        }
        Some(_) => {
            return Err(bad(
                "`tool_choice` must be a string or an object".to_owned(),
                "tool_choice",
            ))
        }
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(bad(
            "`tool_choice` \"required\" needs `tools`".to_owned(),
            "tool_choice",
        )),
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => Err(bad(
            format!(
                "`tool_choice` names the function `{name}`, which is not among `tools` ({})",
                tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "tool_choice",
        )),
        _ => Ok(choice),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use spec_text::Message;

    use super::*;

    fn request(body: Value) -> ChatRequest {
        serde_json::from_value(body).expect("a chat request")
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn a_tool_round_trip_becomes_template_messages() {
        let turn = request(json!({
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
            ],
            "tools": [weather()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false,
            "chat_template_kwargs": {"enable_thinking": false},
            "reasoning_effort": "low",
        }))
        .turn(None)
        .expect("valid");
        assert_eq!(turn.messages[0], Message::system("Be brief."));
        assert_eq!(
            turn.messages[2].tool_calls,
            Some(vec![spec_text::tool_call(
                "call_1",
                "get_weather",
                json!({"city": "Paris"})
            )]),
            "arguments reach the template as an object"
        );
        assert_eq!(
            turn.messages[3],
            Message::tool("call_1", "get_weather", "18 C")
        );
        assert_eq!(turn.tools.len(), 1);
        assert_eq!(turn.tools[0].name, "get_weather");
        assert!(matches!(&turn.tool_choice, ToolChoice::Named(n) if n == "get_weather"));
        assert!(!turn.parallel_tool_calls);
        assert_eq!(turn.template_kwargs["enable_thinking"], json!(false));
        assert_eq!(turn.template_kwargs["reasoning_effort"], json!("low"));
        let plain = request(json!({"messages": [{"role": "user", "content": "hi"}]}))
            .turn(None)
            .expect("valid");
        assert!(matches!(plain.tool_choice, ToolChoice::Auto));
        assert!(plain.parallel_tool_calls && plain.tools.is_empty());
    }

    #[test]
    fn bad_tool_fields_are_400s_naming_the_field() {
        let user = json!({"role": "user", "content": "hi"});
        let call = |arguments: Value| {
            json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "get_weather", "arguments": arguments}}]})
        };
        for (extra, param, names) in [
            (json!({"tools": {"a": 1}}), "tools", "must be a list"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}),
                "tools",
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}),
                "tools",
                "tools[0].name \"no spaces\"",
            ),
            (
                json!({"tools": [weather(), weather()]}),
                "tools",
                "tools[1].name \"get_weather\": another tool",
            ),
            (
                json!({"tools": [{"type": "retrieval"}]}),
                "tools",
                "tools[0].type",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
                "`nope`",
            ),
            (
                json!({"tool_choice": "required"}),
                "tool_choice",
                "needs `tools`",
            ),
            (
                json!({"tool_choice": "sometimes"}),
                "tool_choice",
                "\"sometimes\"",
            ),
            (
                json!({"parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
                "boolean",
            ),
            (
                json!({"chat_template_kwargs": [1]}),
                "chat_template_kwargs",
                "object",
            ),
            (
                json!({"reasoning_effort": "max"}),
                "reasoning_effort",
                "\"low\"",
            ),
            (
                json!({"messages": [user.clone(), call(json!("{not json"))]}),
                "messages",
                "messages[1].tool_calls[0].function.arguments` is not JSON",
            ),
            (
                json!({"messages": [user.clone(), call(json!("[1, 2]"))]}),
                "messages",
                "messages[1].tool_calls[0].function.arguments` must be a JSON object",
            ),
            (
                json!({"messages": [user.clone(), {"role": "tool", "content": "18 C"}]}),
                "messages",
                "messages[1].tool_call_id` is required",
            ),
            (
                json!({"messages": [user.clone(), {"role": "tool", "tool_call_id": "x", "content": "18 C"}]}),
                "messages",
                "`x` answers no call",
            ),
            (
                json!({"messages": [{"role": "narrator", "content": "hi"}]}),
                "messages",
                "messages[0].role",
            ),
            (json!({"messages": []}), "messages", "must not be empty"),
        ] {
            let mut body = json!({"messages": [user.clone()]});
            if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra.clone()) {
                body.extend(extra);
            }
            let err = request(body).turn(None).expect_err("must be refused");
            assert_eq!(
                (err.status.as_u16(), err.param),
                (400, Some(param)),
                "{extra}"
            );
            assert!(err.message.contains(names), "{extra}: {}", err.message);
        }
    }
}
