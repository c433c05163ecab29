//! What a drafter that reads the target's hidden states (DFlash, DSpark)
//! reports reading its `config.json`, checking itself against the target
//! and checking its forward's inputs: each error names the file, key or
//! value at fault. The drafter crates wrap it in their own error beside
//! their checkpoint-specific cases.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use spec_core::TargetInfo;

use crate::config_keys::KeyError;

/// A drafter's config, fit or input error.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// `config.json` could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not JSON; the parser's error is the `source()`.
    #[error("{path}: not a JSON config object: {source}")]
    JsonParse {
        /// The config file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// `config.json` is JSON but not an object.
    #[error("{path}: not a JSON config object: {message}")]
    Json {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A key the drafter needs is absent.
    #[error("{path}: missing config key `{key}`")]
    MissingKey {
        /// The config file.
        path: PathBuf,
        /// The key (a nested one with its object's path:
        /// `dflash_config.block_size`).
        key: String,
    },
    /// A key holds a value of the wrong type or range.
    #[error("{path}: config key `{key}`: {message}")]
    InvalidValue {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A key holds a value this implementation does not support.
    #[error("{path}: config key `{key}` = {value} is not supported (supported: {supported})")]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
        /// Its value, as JSON.
        value: String,
        /// What is supported.
        supported: String,
    },
    /// The drafter does not fit the target it was opened for.
    #[error("the drafter does not fit the target: {what}: drafter {drafter}, target {target}")]
    TargetMismatch {
        /// The config key that differs.
        what: String,
        /// The drafter's value.
        drafter: String,
        /// The target's value.
        target: String,
    },
    /// An input of the drafter's forward has the wrong shape.
    #[error("{what} has shape {found:?}, expected {expected}")]
    Shape {
        /// The input.
        what: String,
        /// Its shape.
        found: Vec<i32>,
        /// What was expected.
        expected: String,
    },
}

/// An error that carries [`DrafterError`]: the config key reader
/// (`config_keys::Keys`) builds its key errors as the shared drafter's.
pub trait CarriesDrafterError: From<DrafterError> {}

impl CarriesDrafterError for DrafterError {}

impl<E: CarriesDrafterError> KeyError for E {
    fn missing(path: &Path, key: String) -> Self {
        DrafterError::MissingKey {
            path: path.to_path_buf(),
            key,
        }
        .into()
    }
    fn invalid(path: &Path, key: String, message: String) -> Self {
        DrafterError::InvalidValue {
            path: path.to_path_buf(),
            key,
            message,
        }
        .into()
    }
    fn unsupported(path: &Path, key: String, value: String, supported: String) -> Self {
        DrafterError::Unsupported {
            path: path.to_path_buf(),
            key,
            value,
            supported,
        }
        .into()
    }
}

/// `dir/config.json` parsed, and its path.
pub fn read_config(dir: &Path) -> Result<(Value, PathBuf), DrafterError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| DrafterError::Io {
        path: path.clone(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|source| DrafterError::JsonParse {
        path: path.clone(),
        source,
    })?;
    Ok((value, path))
}

/// The top-level object of the config at `path`.
pub fn config_object<'a>(
    value: &'a Value,
    path: &Path,
) -> Result<&'a Map<String, Value>, DrafterError> {
    value.as_object().ok_or_else(|| DrafterError::Json {
        path: path.to_path_buf(),
        message: "the top level is not an object".into(),
    })
}

/// What a tapped drafter shares with its target: it reads the target's
/// embeddings, head and the outputs of some of its layers.
#[derive(Debug, Clone, Copy)]
pub struct TapFit<'a> {
    /// The drafter's hidden width.
    pub hidden: i32,
    /// The drafter's vocabulary.
    pub vocab: i32,
    /// How many layers the drafter was trained against.
    pub num_target_layers: usize,
    /// The target layers it taps.
    pub target_layer_ids: &'a [usize],
    /// The config key that lists them (named in the error).
    pub taps_key: &'a str,
}

impl TapFit<'_> {
    /// Checks the drafter against `target`: same hidden width and
    /// vocabulary, the same number of layers, every tap inside it.
    pub fn check(&self, target: &TargetInfo) -> Result<(), DrafterError> {
        let mismatch = |what: &str, drafter: String, target: String| {
            Err(DrafterError::TargetMismatch {
                what: what.to_owned(),
                drafter,
                target,
            })
        };
        if usize::try_from(self.hidden).ok() != Some(target.hidden_size) {
            return mismatch(
                "hidden_size",
                self.hidden.to_string(),
                target.hidden_size.to_string(),
            );
        }
        if usize::try_from(self.vocab).ok() != Some(target.vocab_size) {
            return mismatch(
                "vocab_size",
                self.vocab.to_string(),
                target.vocab_size.to_string(),
            );
        }
        if self.num_target_layers != target.num_layers {
            return mismatch(
                "num_target_layers",
                self.num_target_layers.to_string(),
                target.num_layers.to_string(),
            );
        }
        if let Some(bad) = self
            .target_layer_ids
            .iter()
            .find(|&&l| l >= target.num_layers)
        {
            return mismatch(
                self.taps_key,
                bad.to_string(),
                format!("{} layers", target.num_layers),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> TargetInfo {
        TargetInfo {
            model_type: "llama".into(),
            vocab_size: 64,
            hidden_size: 32,
            num_layers: 4,
            context_length: None,
        }
    }

    fn fit(taps: &[usize]) -> TapFit<'_> {
        TapFit {
            hidden: 32,
            vocab: 64,
            num_target_layers: 4,
            target_layer_ids: taps,
            taps_key: "dflash_config.target_layer_ids",
        }
    }

    fn what(r: Result<(), DrafterError>) -> String {
        match r {
            Err(DrafterError::TargetMismatch { what, .. }) => what,
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn each_mismatch_names_its_key() {
        assert!(fit(&[0, 3]).check(&target()).is_ok());
        assert_eq!(
            what(fit(&[0, 4]).check(&target())),
            "dflash_config.target_layer_ids"
        );
        let t = target();
        let wide = TapFit {
            hidden: 48,
            ..fit(&[0])
        };
        assert_eq!(what(wide.check(&t)), "hidden_size");
        let vocab = TapFit {
            vocab: -1,
            ..fit(&[0])
        };
        assert_eq!(what(vocab.check(&t)), "vocab_size");
        let deep = TapFit {
            num_target_layers: 5,
            ..fit(&[0])
        };
        assert_eq!(what(deep.check(&t)), "num_target_layers");
    }

    #[test]
    fn a_config_that_is_not_an_object_or_not_json_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = read_config(dir.path()).expect_err("no file");
        assert!(matches!(err, DrafterError::Io { .. }), "{err}");
        std::fs::write(dir.path().join("config.json"), "{").expect("write");
        let err = read_config(dir.path()).expect_err("truncated");
        assert!(matches!(err, DrafterError::JsonParse { .. }), "{err}");
        std::fs::write(dir.path().join("config.json"), "[1]").expect("write");
        let (value, path) = read_config(dir.path()).expect("json");
        let err = config_object(&value, &path).expect_err("an array");
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}
