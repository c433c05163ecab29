//! Loading a Hugging Face tokenizer directory: `tokenizer.json`, plus the
//! special tokens and chat template of `tokenizer_config.json` (or
//! `chat_template.jinja`) and the end-of-sequence ids of `generation_config.json`
//! or, without them, of the model's `config.json` (as mlx-lm takes them: GLM-5.2
//! lists three there).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use serde::Deserialize;

use crate::tokenizer::SpecialTokens;
use crate::{TextError, Tokenizer};

// These files carry dozens of keys for Python-side behaviour this crate does
// not model; only the ones below are read and the rest are ignored on purpose.

/// The parts of `tokenizer_config.json` that matter here.
#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    bos_token: Option<TokenSpec>,
    eos_token: Option<TokenSpec>,
    pad_token: Option<TokenSpec>,
    chat_template: Option<ChatTemplateSpec>,
}

/// A special token, written as its text or as a serialised `AddedToken`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenSpec {
    Text(String),
    Added { content: String },
}

/// One template, or several by name of which `default` is the chat template.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ChatTemplateSpec {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// The part of `generation_config.json` (and of the model's `config.json`)
/// that matters here.
#[derive(Debug, Default, Deserialize)]
struct GenerationConfig {
    eos_token_id: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

pub(crate) fn load(tokenizer_json: &Path) -> Result<Tokenizer, TextError> {
    let inner = tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|source| {
        TextError::TokenizerFile {
            path: tokenizer_json.to_owned(),
            source,
        }
    })?;
    let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
    let config: TokenizerConfig =
        read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
    let mut generation: GenerationConfig =
        read_json(&dir.join("generation_config.json"))?.unwrap_or_default();
    if generation.eos_token_id.is_none() {
        let model: GenerationConfig = read_json(&dir.join("config.json"))?.unwrap_or_default();
        generation.eos_token_id = model.eos_token_id;
    }

    let resolve = |spec: Option<TokenSpec>| {
        let text = match spec? {
            TokenSpec::Text(text) | TokenSpec::Added { content: text } => text,
        };
        inner.token_to_id(&text).map(|id| (id, text))
    };
    let bos = resolve(config.bos_token);
    let eos = resolve(config.eos_token);
    let pad = resolve(config.pad_token).map(|(id, _)| id);
    let mut eos_ids: BTreeSet<u32> = eos.iter().map(|(id, _)| *id).collect();
    match generation.eos_token_id {
        Some(OneOrMany::One(id)) => {
            eos_ids.insert(id);
        }
        Some(OneOrMany::Many(ids)) => eos_ids.extend(ids),
        None => {}
    }

    // transformers prefers a separate `chat_template.jinja` when present.
    let jinja = dir.join("chat_template.jinja");
    let chat_template = if jinja.is_file() {
        Some(fs::read_to_string(&jinja).map_err(|source| TextError::Io {
            path: jinja,
            source,
        })?)
    } else {
        match config.chat_template {
            Some(ChatTemplateSpec::One(template)) => Some(template),
            Some(ChatTemplateSpec::Named(templates)) => templates
                .into_iter()
                .find(|t| t.name == "default")
                .map(|t| t.template),
            None => None,
        }
    };
    Ok(Tokenizer::new(
        inner,
        SpecialTokens {
            bos,
            eos,
            pad,
            eos_ids,
        },
        chat_template,
    ))
}

/// Parses `path` if it exists.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, TextError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(path).map_err(|source| TextError::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TextError::ConfigFile {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Hugging Face directory holding the real model's tokenizer, written
    /// from the GGUF-built one, plus the given config files.
    fn hf_dir(configs: &[(&str, String)]) -> (tempfile::TempDir, Tokenizer) {
        let path = spec_hub::default_model().expect("default model");
        let gguf = Tokenizer::from_gguf(&path).expect("GGUF tokenizer");
        let dir = tempfile::tempdir().expect("tempdir");
        gguf.inner
            .save(dir.path().join("tokenizer.json"), false)
            .expect("save tokenizer.json");
        for (name, text) in configs {
            fs::write(dir.path().join(name), text).expect("write config");
        }
        (dir, gguf)
    }

    #[test]
    fn to_json_reads_back_as_the_same_tokenizer() {
        let (dir, gguf) = hf_dir(&[]);
        let json = gguf.to_json().expect("to_json");
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(
            value["model"]["vocab"].as_object().map(|v| v.len()),
            Some(gguf.vocab_size())
        );
        let path = dir.path().join("from_json.json");
        fs::write(&path, &json).expect("write");
        let back = Tokenizer::from_file(&path).expect("load");
        let text = "Hello, Zoë! {\"a\": [1, 2]}";
        assert_eq!(
            back.encode(text, false).expect("encode"),
            gguf.encode(text, false).expect("encode")
        );
    }

    #[test]
    fn tokenizer_json_with_configs_matches_the_gguf_tokenizer() {
        let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        let config = serde_json::json!({
            "bos_token": {"content": "<|im_start|>", "lstrip": false, "special": true},
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": template,
            "model_max_length": 8192,
        });
        let generation = serde_json::json!({"bos_token_id": 1, "eos_token_id": [2, 0]});
        let (dir, gguf) = hf_dir(&[
            ("tokenizer_config.json", config.to_string()),
            ("generation_config.json", generation.to_string()),
        ]);
        let hf = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("load");
        assert_eq!(hf.vocab_size(), gguf.vocab_size());
        for text in [
            "What is the capital of France?",
            "In 2024: 日本語 😀",
            "<|im_start|>user\nHi<|im_end|>",
        ] {
            assert_eq!(
                hf.encode(text, true).expect("encode"),
                gguf.encode(text, true).expect("encode"),
                "{text:?}"
            );
        }
        assert_eq!(hf.bos_token_id(), Some(1));
        assert_eq!(hf.eos_token(), Some("<|im_end|>"));
        assert_eq!(hf.pad_token_id(), Some(0));
        assert_eq!(
            hf.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [0, 2]
        );
        assert_eq!(hf.chat_template_source(), Some(template));
    }

    /// mlx-lm's rule: `generation_config.json`'s ids, else `config.json`'s,
    /// plus the tokenizer's own EOS token.
    #[test]
    fn eos_ids_from_config_json_when_generation_config_has_none() {
        let config = serde_json::json!({"eos_token": "<|im_end|>"});
        let model = serde_json::json!({"model_type": "glm_moe_dsa", "eos_token_id": [7, 9, 11]});
        let (dir, _) = hf_dir(&[
            ("tokenizer_config.json", config.to_string()),
            ("config.json", model.to_string()),
        ]);
        let json = dir.path().join("tokenizer.json");
        let hf = Tokenizer::from_file(&json).expect("load");
        assert_eq!(
            hf.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [2, 7, 9, 11]
        );
        assert!([7, 9, 11].iter().all(|&id| hf.is_eos(id)));
        let generation = serde_json::json!({"eos_token_id": 5});
        fs::write(
            dir.path().join("generation_config.json"),
            generation.to_string(),
        )
        .expect("write");
        let hf = Tokenizer::from_file(&json).expect("load");
        assert_eq!(
            hf.eos_token_ids().iter().copied().collect::<Vec<_>>(),
            [2, 5],
            "generation_config.json's ids replace config.json's"
        );
    }

    #[test]
    fn named_templates_and_chat_template_jinja() {
        let config = serde_json::json!({
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "default"},
            ],
        });
        let (dir, _) = hf_dir(&[("tokenizer_config.json", config.to_string())]);
        let json = dir.path().join("tokenizer.json");
        let hf = Tokenizer::from_file(&json).expect("load");
        assert_eq!(hf.chat_template_source(), Some("default"));
        assert_eq!(hf.bos_token_id(), None);
        assert!(hf.eos_token_ids().is_empty());

        fs::write(dir.path().join("chat_template.jinja"), "from jinja file").expect("write");
        let hf = Tokenizer::from_file(&json).expect("load");
        assert_eq!(hf.chat_template_source(), Some("from jinja file"));
    }

    #[test]
    fn malformed_config_names_the_file() {
        let (dir, _) = hf_dir(&[(
            "generation_config.json",
            "{\"eos_token_id\": \"two\"}".to_owned(),
        )]);
        let err = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect_err("bad config");
        assert!(
            matches!(&err, TextError::ConfigFile { path, .. } if path.ends_with("generation_config.json")),
            "{err}"
        );
    }
}
