//! Tool-call formats: which syntax a model writes its calls in, read from
//! what its chat template writes for an assistant's `tool_calls`.

/// A family of tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>` (Hermes,
    /// Qwen2.5, Qwen3); also the fallback for templates that know no tools.
    Hermes,
    /// A bare JSON object `{"name": .., "parameters": {..}}`, optionally after
    /// `<|python_tag|>` (Llama 3.1 to 3.3).
    Llama3Json,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>`
    /// (Qwen3-Coder).
    Qwen3Coder,
    /// `[TOOL_CALLS] [{"name": .., "arguments": {..}}]` or the newer
    /// `[TOOL_CALLS]name[ARGS]{..}` (Mistral).
    Mistral,
    /// `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>`
    /// (GLM-4.5, 4.6, 5).
    Glm45,
    /// `<|tool_call>call:NAME{key:value,..}<tool_call|>` with strings between
    /// `<|"|>` marks (Gemma 4).
    Gemma4,
    /// OpenAI's harmony messages (gpt-oss): a call is a message to
    /// `functions.NAME` on the commentary channel, its body the JSON
    /// arguments, ended by `<|call|>`; one call per response.
    Harmony,
}

impl ToolFormat {
    /// Every format, in detection order.
    pub const ALL: [ToolFormat; 7] = [
        Self::Harmony,
        Self::Gemma4,
        Self::Qwen3Coder,
        Self::Glm45,
        Self::Mistral,
        Self::Hermes,
        Self::Llama3Json,
    ];

    /// The format the template itself writes for assistant `tool_calls` /
    /// describes to the model; `None` when the template knows no tools.
    /// The most specific marks are tried first: Qwen3-Coder and GLM also
    /// write `<tool_call>`, which alone means Hermes.
    pub fn detect(template_source: &str) -> Option<ToolFormat> {
        let has = |mark: &str| template_source.contains(mark);
        if !has("tool") {
            return None;
        }
        Self::ALL.into_iter().find(|format| match format {
            Self::Harmony => has("<|channel|>") && has("<|call|>"),
            Self::Gemma4 => has("<|tool_call>"),
            Self::Qwen3Coder => has("<function=") && has("<parameter="),
            Self::Glm45 => has("<arg_key>"),
            Self::Mistral => has("[TOOL_CALLS]"),
            Self::Hermes => has("<tool_call>"),
            Self::Llama3Json => {
                has("<|python_tag|>") || (has("<|start_header_id|>") && has("\"parameters\": "))
            }
        })
    }

    /// A short stable name (`hermes`, `llama3_json`, ...) for logs and tests.
    pub fn id(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Qwen3Coder => "qwen3_coder",
            Self::Mistral => "mistral",
            Self::Glm45 => "glm45",
            Self::Gemma4 => "gemma4",
            Self::Harmony => "harmony",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct() {
        let ids: std::collections::BTreeSet<_> = ToolFormat::ALL.iter().map(|f| f.id()).collect();
        assert_eq!(ids.len(), ToolFormat::ALL.len());
    }

    #[test]
    fn a_template_without_tools_has_no_format() {
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        assert_eq!(ToolFormat::detect(chatml), None);
    }
}
