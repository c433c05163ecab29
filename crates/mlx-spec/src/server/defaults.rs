//! What a request gets when it does not say: `serve`'s flags for the
//! sampling defaults and `max_tokens` (mlx_lm.server's `--temp`,
//! `--top-p`, `--top-k`, `--min-p`, `--max-tokens`), the chat template and
//! its variables (`--chat-template`, `--chat-template-args`), and
//! speculation with a draft model (`--draft-model`, `--num-draft-tokens`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

/// The flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DefaultArgs {
    /// Default `max_tokens`.
    #[arg(
        long = "default-max-tokens",
        visible_alias = "max-tokens",
        default_value_t = 256
    )]
    pub max_tokens: usize,
    /// Default sampling temperature (0 to 2; 0 is greedy). OpenAI's default,
    /// 1, unless set (mlx_lm.server's is 0).
    #[arg(long = "temp", default_value_t = 1.0)]
    pub temperature: f32,
    /// Default nucleus threshold (0 to 1; 1 is off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Default top-k (0 is off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Default min-p (0 to 1; 0 is off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// The chat template to use instead of the tokenizer's: a file, or the
    /// template's text.
    #[arg(long, value_name = "FILE_OR_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Template variables every chat request gets, a JSON object (e.g.
    /// `{"enable_thinking": false}`); a request's `chat_template_kwargs`
    /// override them.
    #[arg(long, value_name = "JSON")]
    pub chat_template_args: Option<String>,
    /// A draft model to speculate with (`--draft-provider draft-model` with
    /// its `model` option; the default provider unless another is listed
    /// first).
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Draft tokens per round of the default provider (1 to 16; default:
    /// the provider's own).
    #[arg(long, value_name = "N")]
    pub num_draft_tokens: Option<usize>,
}

/// The sampling defaults and `max_tokens` of a request that sets none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestDefaults {
    /// `max_tokens`.
    pub max_tokens: usize,
    /// `temperature`.
    pub temperature: f32,
    /// `top_p`.
    pub top_p: f32,
    /// `top_k` (0: off).
    pub top_k: usize,
    /// `min_p`.
    pub min_p: f32,
}

impl DefaultArgs {
    /// The request defaults, each in the range a request's own must be in
    /// (`top_k` below the model's vocabulary `vocab`).
    pub fn request_defaults(&self, vocab: usize) -> Result<RequestDefaults> {
        if !(1..=1_000_000).contains(&self.max_tokens) {
            bail!("--default-max-tokens must be between 1 and 1000000");
        }
        if !(self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature)) {
            bail!("--temp must be between 0 and 2, got {}", self.temperature);
        }
        for (name, v) in [("--top-p", self.top_p), ("--min-p", self.min_p)] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                bail!("{name} must be between 0 and 1, got {v}");
            }
        }
        if self.top_k >= vocab {
            bail!(
                "--top-k must be below the vocabulary's {vocab} (0 is off), got {}",
                self.top_k
            );
        }
        Ok(RequestDefaults {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
        })
    }

    /// `--chat-template`'s text: the file it names, else itself.
    pub fn chat_template_source(&self) -> Result<Option<String>> {
        let Some(arg) = &self.chat_template else {
            return Ok(None);
        };
        let path = Path::new(arg);
        if path.is_file() {
            return std::fs::read_to_string(path)
                .with_context(|| format!("--chat-template: reading {}", path.display()))
                .map(Some);
        }
        Ok(Some(arg.clone()))
    }

    /// `--chat-template-args`: a JSON object.
    pub fn template_kwargs(&self) -> Result<Map<String, Value>> {
        let Some(text) = &self.chat_template_args else {
            return Ok(Map::new());
        };
        crate::json_arg::object("--chat-template-args", text)
    }

    /// `--num-draft-tokens`, checked as a request's `num_draft_tokens`.
    pub fn num_draft(&self) -> Result<Option<usize>> {
        match self.num_draft_tokens {
            Some(n) if !(1..=16).contains(&n) => {
                bail!("--num-draft-tokens must be between 1 and 16, got {n}")
            }
            n => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> DefaultArgs {
        crate::parse_flags(args)
    }

    #[test]
    fn defaults_are_openais_and_flags_set_them() {
        let d = parse(&[]).request_defaults(100).expect("valid");
        assert_eq!(
            (d.max_tokens, d.temperature, d.top_p, d.top_k),
            (256, 1.0, 1.0, 0)
        );
        let d = parse(&[
            "--temp",
            "0",
            "--max-tokens",
            "9",
            "--top-k",
            "5",
            "--min-p",
            "0.1",
        ])
        .request_defaults(100)
        .expect("valid");
        assert_eq!(
            (d.max_tokens, d.temperature, d.top_k, d.min_p),
            (9, 0.0, 5, 0.1)
        );
    }

    #[test]
    fn out_of_range_flags_are_named() {
        for (args, name) in [
            (&["--temp", "3"][..], "--temp"),
            (&["--top-p", "1.5"][..], "--top-p"),
            (&["--min-p=-0.1"][..], "--min-p"),
            (&["--top-k", "100"][..], "--top-k"),
            (&["--default-max-tokens", "0"][..], "--default-max-tokens"),
        ] {
            let err = parse(args).request_defaults(100).expect_err("out of range");
            assert!(err.to_string().contains(name), "{err}");
        }
        let err = parse(&["--num-draft-tokens", "17"])
            .num_draft()
            .expect_err("range");
        assert!(err.to_string().contains("--num-draft-tokens"), "{err}");
        let err = parse(&["--chat-template-args", "[1]"])
            .template_kwargs()
            .expect_err("array");
        assert!(err.to_string().contains("--chat-template-args"), "{err}");
    }

    #[test]
    fn a_chat_template_is_a_file_or_the_text() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("t.jinja");
        std::fs::write(&file, "{{ messages[0].content }}").expect("write");
        let d = parse(&["--chat-template", file.to_str().expect("utf-8")]);
        assert_eq!(
            d.chat_template_source().expect("read").as_deref(),
            Some("{{ messages[0].content }}")
        );
        let d = parse(&["--chat-template", "{{ 1 }}"]);
        assert_eq!(
            d.chat_template_source().expect("text").as_deref(),
            Some("{{ 1 }}")
        );
    }
}
