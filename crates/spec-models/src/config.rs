//! `config.json` as mlx-lm / Hugging Face write it, parsed into validated
//! internal configurations. Unknown keys are common in HF configs and are
//! ignored; values we would silently mis-handle (an unknown RoPE type, an
//! activation we do not implement, inconsistent head counts) are errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ModelError;

/// The keys every config has, read first to pick the architecture.
#[derive(Debug, Deserialize)]
pub struct ConfigHeader {
    /// Architecture name.
    pub model_type: String,
}

/// Reads and parses `dir/config.json` into `T`.
pub fn read_config<T: for<'de> Deserialize<'de>>(dir: &Path) -> Result<(T, PathBuf), ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
        path: path.clone(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: path.clone(),
        message: e.to_string(),
    })?;
    Ok((value, path))
}

/// Group size and bits of one quantized module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    /// Elements sharing a scale and bias.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
}

/// mlx-lm's `quantization` block: defaults plus per-module overrides (a
/// module path mapped to its own parameters, or `false` for full precision).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quantization {
    /// Parameters for modules without an override.
    pub default: Option<QuantParams>,
    /// `module path -> Some(params)` or `None` (kept full precision).
    pub overrides: HashMap<String, Option<QuantParams>>,
}

impl Quantization {
    /// Parses the block; `path` names the config in errors.
    pub fn parse(block: Option<&serde_json::Value>, path: &Path) -> Result<Self, ModelError> {
        let bad = |message: String| ModelError::Config {
            path: path.to_path_buf(),
            message,
        };
        let Some(block) = block else {
            return Ok(Self::default());
        };
        let obj = block
            .as_object()
            .ok_or_else(|| bad("`quantization` must be an object".into()))?;
        let params = |v: &serde_json::Value, what: &str| -> Result<QuantParams, ModelError> {
            if let Some(mode) = v
                .get("mode")
                .and_then(|m| m.as_str())
                .filter(|m| *m != "affine")
            {
                return Err(bad(format!(
                    "{what}: quantization mode `{mode}` is not supported (affine is)"
                )));
            }
            let gs = v
                .get("group_size")
                .and_then(|g| g.as_i64())
                .ok_or_else(|| bad(format!("{what}: missing group_size")))?;
            let bits = v
                .get("bits")
                .and_then(|b| b.as_i64())
                .ok_or_else(|| bad(format!("{what}: missing bits")))?;
            if ![2, 3, 4, 5, 6, 8].contains(&bits) {
                return Err(bad(format!("{what}: unsupported bits {bits}")));
            }
            if ![32, 64, 128].contains(&gs) {
                return Err(bad(format!("{what}: unsupported group_size {gs}")));
            }
            Ok(QuantParams {
                group_size: gs as i32,
                bits: bits as i32,
            })
        };
        let mut q = Self::default();
        if obj.contains_key("bits") || obj.contains_key("group_size") {
            q.default = Some(params(block, "quantization")?);
        }
        for (key, value) in obj {
            match key.as_str() {
                "bits" | "group_size" | "mode" | "quant_method" => {}
                _ if value.is_object() => {
                    q.overrides.insert(key.clone(), Some(params(value, key)?));
                }
                _ if value == &serde_json::Value::Bool(false) => {
                    q.overrides.insert(key.clone(), None);
                }
                _ => {
                    return Err(bad(format!(
                        "quantization.{key}: expected an object or false"
                    )))
                }
            }
        }
        Ok(q)
    }

    /// The parameters for the module at `path` (e.g. `model.layers.0.mlp.up_proj`).
    pub fn for_module(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.get(path) {
            Some(p) => *p,
            None => self.default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_block_with_overrides() {
        let block = serde_json::json!({
            "group_size": 64, "bits": 4,
            "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
            "lm_head": false
        });
        let q = Quantization::parse(Some(&block), Path::new("config.json")).expect("parse");
        assert_eq!(
            q.for_module("model.layers.1.mlp.up_proj"),
            Some(QuantParams {
                group_size: 64,
                bits: 4
            })
        );
        assert_eq!(
            q.for_module("model.layers.0.mlp.down_proj"),
            Some(QuantParams {
                group_size: 32,
                bits: 8
            })
        );
        assert_eq!(q.for_module("lm_head"), None);
    }

    #[test]
    fn bad_quantization_values_name_the_problem() {
        for (block, needle) in [
            (serde_json::json!({"group_size": 64, "bits": 7}), "bits 7"),
            (
                serde_json::json!({"group_size": 48, "bits": 4}),
                "group_size 48",
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4, "x": 3}),
                "quantization.x",
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4, "mode": "mxfp4"}),
                "mxfp4",
            ),
        ] {
            let err = Quantization::parse(Some(&block), Path::new("c.json"))
                .expect_err("must fail")
                .to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
