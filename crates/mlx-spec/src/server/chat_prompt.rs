//! A chat turn's prompt: the model's template (compiled once, its tool-call
//! format and reasoning markers read from its source once) rendered with
//! the turn's tools and template variables. A template that knows no tools
//! (SmolLM2's ChatML) gets them described in a system message, in the
//! Hermes call syntax, and sees earlier calls and results written out in
//! that syntax.

use serde_json::{Map, Value};
use spec_agent::{Reasoning, Tool, ToolChoice, ToolFormat};
use spec_text::{ChatTemplate, Message, RenderOptions, Tokenizer};

use super::api::ApiError;
use super::chat_turn::ChatTurn;

/// What the server knows of the model's chat template.
pub struct ChatSetup {
    /// The compiled template, or why the model has none usable.
    template: Result<ChatTemplate, String>,
    /// Template variables every turn gets (`--chat-template-args`), under
    /// the turn's own.
    default_kwargs: Map<String, Value>,
    /// The call format the template writes; `None`: it knows no tools.
    format: Option<ToolFormat>,
    /// The template's reasoning markers, when it is a thinking model's.
    reasoning: Option<Reasoning>,
}

/// A turn's prompt and what its output's parser and grammar need.
pub struct Rendered {
    /// The prompt text.
    pub text: String,
    /// The format calls are parsed (and constrained) in; `None` when no
    /// call may be made (no tools, or `tool_choice: none`).
    pub format: Option<ToolFormat>,
    /// The reasoning the output starts with, and whether the prompt opened
    /// it already; `None` when none is expected.
    pub reasoning: Option<(Reasoning, bool)>,
}

impl ChatSetup {
    /// Compiles the tokenizer's template and reads its formats.
    /// The tokenizer's template, or `custom` (`--chat-template`) with the
    /// tokenizer's BOS and EOS tokens; `default_kwargs` under every turn's.
    pub fn new(
        tokenizer: &Tokenizer,
        custom: Option<&str>,
        default_kwargs: Map<String, Value>,
    ) -> Self {
        let template = match custom {
            Some(source) => ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())
                .map_err(|e| format!("--chat-template: {e}")),
            None => tokenizer.chat_template().map_err(|e| e.to_string()),
        };
        Self {
            default_kwargs,
            ..Self::of(template)
        }
    }

    /// The setup of a compiled template (or why there is none).
    fn of(template: Result<ChatTemplate, String>) -> Self {
        let Ok(template) = template else {
            return Self {
                template,
                default_kwargs: Map::new(),
                format: None,
                reasoning: None,
            };
        };
        let format = ToolFormat::detect(template.source());
        let reasoning = Reasoning::detect(template.source());
        tracing::info!(
            tool_format = format.map_or("none (a system prompt describes tools)", ToolFormat::id),
            reasoning = reasoning.is_some(),
            "chat template read"
        );
        Self {
            template: Ok(template),
            default_kwargs: Map::new(),
            format,
            reasoning,
        }
    }

    /// The prompt for `turn`, ending with the assistant's generation prompt.
    pub fn render(&self, turn: &ChatTurn) -> Result<Rendered, ApiError> {
        let template = self.template.as_ref().map_err(|e| {
            ApiError::invalid(format!("this model has no usable chat template: {e}"), None)
        })?;
        // Under `tool_choice: none` the tools are still described (the
        // prompt keeps the prefix the other turns of a loop share), but
        // no call is parsed or constrained.
        let offered = !turn.tools.is_empty();
        let calls = offered && !matches!(turn.tool_choice, ToolChoice::None);
        let tools_json: Vec<Value> = turn.tools.iter().map(Tool::openai_json).collect();
        let (messages, tools, format) = match self.format {
            Some(format) => (
                spec_agent::template_messages(Some(format), &turn.messages),
                offered.then_some(tools_json.as_slice()),
                calls.then_some(format),
            ),
            None => (
                fallback_messages(
                    &turn.messages,
                    offered.then(|| spec_agent::fallback_tools_prompt(&turn.tools)),
                ),
                None,
                calls.then_some(ToolFormat::Hermes),
            ),
        };
        let mut kwargs = self.default_kwargs.clone();
        kwargs.extend(turn.template_kwargs.clone());
        let options = RenderOptions {
            add_generation_prompt: true,
            tools,
            kwargs: Some(&kwargs),
        };
        let text = template.render_with(&messages, &options).map_err(|e| {
            ApiError::invalid(
                format!("the chat template rejected the messages: {e}"),
                Some("messages"),
            )
        })?;
        let reasoning = self
            .reasoning
            .as_ref()
            .filter(|r| !r.closed_by(&text))
            .map(|r| (r.clone(), r.opened_by(&text)));
        Ok(Rendered {
            text,
            format,
            reasoning,
        })
    }
}

/// A call of an assistant's `tool_calls` written as the fallback grammar
/// lays it out (what the model generated, so the history keeps its tokens).
fn hermes_call(call: &Value) -> String {
    let function = &call["function"];
    spec_agent::fallback_call_text(
        function["name"].as_str().unwrap_or_default(),
        &function["arguments"],
    )
}

/// `messages` for a template that knows no tools: `tools_prompt` merged
/// into the first system message (or one added); assistant calls written
/// into their content; tool results as user turns in `<tool_response>`.
fn fallback_messages(messages: &[Message], tools_prompt: Option<String>) -> Vec<Message> {
    let mut out: Vec<Message> = messages
        .iter()
        .map(|m| match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) => {
                let mut text = m.content.clone();
                for call in calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&hermes_call(call));
                }
                Message::assistant(text)
            }
            ("tool", _) => {
                Message::user(format!("<tool_response>\n{}\n</tool_response>", m.content))
            }
            _ => Message {
                tool_calls: None,
                tool_call_id: None,
                name: None,
                ..m.clone()
            },
        })
        .collect();
    if let Some(prompt) = tools_prompt {
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{prompt}", first.content);
            }
            _ => out.insert(0, Message::system(prompt)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Qwen3's template (spec-agent's fixture: its README says where it
    /// came from): tools in its own `<tools>` block, `enable_thinking`
    /// reaching it.
    #[test]
    fn a_thinking_template_with_tools_gets_them_natively_and_its_kwargs() {
        let source = include_str!("../../../spec-agent/tests/templates/qwen3.jinja");
        let setup = ChatSetup::of(
            ChatTemplate::new(source, None, Some("<|im_end|>")).map_err(|e| e.to_string()),
        );
        let weather = Tool {
            name: "get_weather".into(),
            description: Some("The weather in a city".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        };
        let call = spec_text::tool_call("call_1", "get_weather", json!({"city": "Paris"}));
        let mut turn = ChatTurn::new(vec![
            Message::user("Weather in Paris?"),
            Message::assistant_calls("", vec![call]),
            Message::tool("call_1", "get_weather", "18 C"),
        ]);
        turn.tools = vec![weather];
        let thinking = setup.render(&turn).expect("renders");
        assert_eq!(thinking.format, Some(ToolFormat::Hermes));
        assert!(
            thinking.text.contains("\"name\": \"get_weather\""),
            "{}",
            thinking.text
        );
        assert!(
            thinking.text.contains("<tool_response>\n18 C"),
            "{}",
            thinking.text
        );
        let (reasoning, opened) = thinking.reasoning.expect("a thinking model");
        assert_eq!((reasoning.open(), opened), ("<think>", false));

        turn.template_kwargs
            .insert("enable_thinking".into(), json!(false));
        turn.tool_choice = ToolChoice::None;
        let quiet = setup.render(&turn).expect("renders");
        assert!(quiet.reasoning.is_none(), "the prompt closed the reasoning");
        assert_eq!(quiet.format, None, "tool_choice none parses no call");
        assert!(
            quiet.text.contains("\"name\": \"get_weather\""),
            "tools still described"
        );
    }

    #[test]
    fn templates_without_tools_see_them_in_a_system_message_and_the_hermes_syntax() {
        let call = spec_text::tool_call("call_1", "get_weather", json!({"city": "Paris"}));
        let history = [
            Message::system("Be brief."),
            Message::user("Weather?"),
            Message::assistant_calls("", vec![call]),
            Message::tool("call_1", "get_weather", "18 C"),
        ];
        let out = fallback_messages(&history, Some("TOOLS".to_owned()));
        assert_eq!(out[0], Message::system("Be brief.\n\nTOOLS"));
        assert_eq!(out[1], Message::user("Weather?"));
        assert_eq!(out[2].role, "assistant");
        let written = out[2]
            .content
            .strip_prefix("<tool_call>\n")
            .and_then(|c| c.strip_suffix("\n</tool_call>"))
            .expect("a Hermes call");
        assert_eq!(
            serde_json::from_str::<Value>(written).expect("JSON"),
            json!({"name": "get_weather", "arguments": {"city": "Paris"}})
        );
        assert_eq!(
            out[3],
            Message::user("<tool_response>\n18 C\n</tool_response>")
        );
        let added = fallback_messages(&history[1..2], Some("TOOLS".to_owned()));
        assert_eq!(added, [Message::system("TOOLS"), Message::user("Weather?")]);
        assert_eq!(fallback_messages(&history[1..2], None), history[1..2]);
    }
}
