//! Reasoning markers: where a thinking model's thoughts open and close
//! (`<think>`..`</think>` in Qwen3 and GLM, Gemma 4's thought channel,
//! gpt-oss's analysis channel), read from the chat template, and whether a
//! rendered prompt left them open.

/// The markers around a model's reasoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reasoning {
    pub(crate) open: &'static str,
    pub(crate) close: &'static str,
}

/// gpt-oss's analysis message (the harmony format: its output is parsed
/// message by message, see `parser/harmony.rs`).
pub(crate) const HARMONY: Reasoning = Reasoning {
    open: "<|channel|>analysis<|message|>",
    close: "<|end|>",
};

/// The marker pairs we know, most specific first.
const KNOWN: [Reasoning; 3] = [
    HARMONY,
    Reasoning {
        open: "<|channel>thought",
        close: "<channel|>",
    },
    Reasoning {
        open: "<think>",
        close: "</think>",
    },
];

impl Reasoning {
    /// The reasoning markers the template writes, if it has any.
    pub fn detect(template_source: &str) -> Option<Reasoning> {
        let has = |mark: &str| template_source.contains(mark);
        KNOWN.into_iter().find(|r| {
            // Gemma 4 spells the channel's name in a separate string.
            let open = r.open.split_once("thought").map_or(r.open, |(o, _)| o);
            has(open) && has(r.close)
        })
    }

    /// Whether these are the harmony format's (gpt-oss) markers.
    pub fn is_harmony(&self) -> bool {
        *self == HARMONY
    }

    /// The text that opens reasoning.
    pub fn open(&self) -> &str {
        self.open
    }

    /// The text that closes reasoning.
    pub fn close(&self) -> &str {
        self.close
    }

    /// True when the rendered prompt ends inside an open reasoning block
    /// (a template that writes `<think>\n` into the generation prompt).
    pub fn opened_by(&self, prompt: &str) -> bool {
        let Some(at) = prompt.rfind(self.open) else {
            return false;
        };
        prompt[at + self.open.len()..].trim().is_empty()
    }

    /// True when the prompt closed reasoning already (Qwen3 with
    /// `enable_thinking=false` writes an empty `<think>\n\n</think>\n\n`):
    /// no reasoning expected.
    pub fn closed_by(&self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.close)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_and_closed_prompts() {
        let think = Reasoning::detect("{{ '<think>' }}..{{ '</think>' }}").expect("think");
        assert_eq!((think.open(), think.close()), ("<think>", "</think>"));
        assert!(think.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!think.opened_by("<|im_start|>assistant\n"));
        assert!(!think.opened_by("<think>\n\n</think>\n\n"));
        assert!(think.closed_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!think.closed_by("<think>a</think>\n<|im_start|>assistant\n"));
        assert_eq!(Reasoning::detect("plain {{ messages }}"), None);
    }
}
