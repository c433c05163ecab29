//! The family templates and the conversation the tests render through them.
#![allow(dead_code)]

use serde_json::{json, Value};
use spec_agent::{Reasoning, Tool, ToolFormat};
use spec_text::{tool_call, ChatTemplate, Message, RenderOptions};

/// One family's template and what we expect of it.
pub struct Family {
    pub file: &'static str,
    pub bos: Option<&'static str>,
    pub eos: Option<&'static str>,
    pub format: ToolFormat,
    /// The reasoning open marker, if the template has reasoning.
    pub reasoning: Option<&'static str>,
    /// Where the assistant's turn ends in a rendering (the end of generation).
    pub end_of_turn: Option<&'static str>,
}

pub const FAMILIES: [Family; 8] = [
    Family {
        file: "qwen3.jinja",
        bos: None,
        eos: Some("<|im_end|>"),
        format: ToolFormat::Hermes,
        reasoning: Some("<think>"),
        end_of_turn: Some("<|im_end|>"),
    },
    Family {
        file: "qwen3-coder.jinja",
        bos: None,
        eos: Some("<|im_end|>"),
        format: ToolFormat::Qwen3Coder,
        reasoning: None,
        end_of_turn: Some("<|im_end|>"),
    },
    Family {
        file: "llama-3.2.jinja",
        bos: Some("<|begin_of_text|>"),
        eos: Some("<|eot_id|>"),
        format: ToolFormat::Llama3Json,
        reasoning: None,
        end_of_turn: Some("<|eot_id|>"),
    },
    Family {
        file: "mistral-small-3.1.jinja",
        bos: Some("<s>"),
        eos: Some("</s>"),
        format: ToolFormat::Mistral,
        reasoning: None,
        end_of_turn: Some("</s>"),
    },
    Family {
        file: "mistral-small-3.2.jinja",
        bos: Some("<s>"),
        eos: Some("</s>"),
        format: ToolFormat::Mistral,
        reasoning: None,
        end_of_turn: Some("</s>"),
    },
    Family {
        file: "glm-4.6.jinja",
        bos: None,
        eos: Some("<|endoftext|>"),
        format: ToolFormat::Glm45,
        reasoning: Some("<think>"),
        end_of_turn: None,
    },
    Family {
        file: "gemma-4.jinja",
        bos: Some("<bos>"),
        eos: Some("<eos>"),
        format: ToolFormat::Gemma4,
        reasoning: Some("<|channel>thought"),
        end_of_turn: Some("<turn|>"),
    },
    Family {
        file: "gpt-oss.jinja",
        bos: None,
        eos: Some("<|return|>"),
        format: ToolFormat::Harmony,
        reasoning: Some("<|channel|>analysis<|message|>"),
        // A call's message ends generation.
        end_of_turn: Some("<|call|>"),
    },
];

pub fn source(file: &str) -> String {
    let path = format!("{}/tests/templates/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn template(family: &Family) -> ChatTemplate {
    ChatTemplate::new(&source(family.file), family.bos, family.eos).expect(family.file)
}

pub fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"}
            },
            "required": ["city"]
        }),
    }
}

/// Keys in sorted order, as Gemma's template writes them.
pub fn arguments() -> Value {
    json!({"city": "Paris, France", "days": 3, "metric": true})
}

pub const CALL_ID: &str = "call00001";

pub fn conversation() -> Vec<Message> {
    vec![
        Message::system("You are a weather bot."),
        Message::user("What's the weather in Paris?"),
        Message::assistant_calls("", vec![tool_call(CALL_ID, "get_weather", arguments())]),
        Message::tool(CALL_ID, "get_weather", "Sunny, 21 degrees"),
    ]
}

pub fn render(family: &Family, messages: &[Message], add_generation_prompt: bool) -> String {
    let tools = [weather().openai_json()];
    template(family)
        .render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                tools: Some(&tools),
                kwargs: None,
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", family.file))
}

/// What the template writes for the final assistant turn of `messages`:
/// its rendering past the generation prompt of the turns before, up to the
/// end of the turn (where generation stops).
pub fn assistant_text(family: &Family, messages: &[Message]) -> String {
    let (_, before) = messages.split_last().expect("an assistant turn");
    let prompt = render(family, before, true);
    let full = render(family, messages, false);
    // A generation prompt that closes reasoning (Gemma 4 writes an empty
    // thought channel) is the turn's opening plus that block.
    let common = if full.starts_with(&prompt) {
        prompt.len()
    } else {
        let reasoning = Reasoning::detect(&source(family.file))
            .expect("a prompt that is no prefix closes reasoning");
        let opening = &prompt[..prompt.rfind(reasoning.open()).expect("the open marker")];
        assert!(
            full.starts_with(opening),
            "{}: {prompt:?} / {full:?}",
            family.file
        );
        opening.len()
    };
    let text = &full[common..];
    match family.end_of_turn.and_then(|end| text.find(end)) {
        Some(at) => text[..at].to_owned(),
        None => text.to_owned(),
    }
}
