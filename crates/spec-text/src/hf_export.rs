//! Writing a tokenizer as Hugging Face files (`tokenizer.json`,
//! `tokenizer_config.json`), so other tools (mlx-lm, transformers) can load
//! a model we converted, e.g. from GGUF.

use std::path::Path;

use crate::{TextError, Tokenizer};

impl Tokenizer {
    /// Writes `tokenizer.json` and `tokenizer_config.json` into `dir`.
    pub fn save_hf_files(&self, dir: &Path) -> Result<(), TextError> {
        let tokenizer_json = dir.join("tokenizer.json");
        self.inner
            .save(&tokenizer_json, false)
            .map_err(|source| TextError::WriteTokenizer {
                path: tokenizer_json.clone(),
                source,
            })?;
        let mut config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": false,
            "model_max_length": 1_000_000,
        });
        if let Some(bos) = self.bos_token() {
            config["bos_token"] = bos.into();
        }
        if let Some(eos) = self.eos_token() {
            config["eos_token"] = eos.into();
        }
        if let Some(pad) = self.pad_token_id().and_then(|id| self.id_to_token(id)) {
            config["pad_token"] = pad.into();
        }
        if let Some(template) = self.chat_template_source() {
            config["chat_template"] = template.into();
        }
        let config_path = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&config).map_err(|e| TextError::Write {
            path: config_path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(&config_path, text).map_err(|source| TextError::Write {
            path: config_path,
            source,
        })
    }
}
