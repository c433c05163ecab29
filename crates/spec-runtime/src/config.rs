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
    let value = serde_json::from_str(&text).map_err(|e| ModelError::config_parse(&path, "", e))?;
    Ok((value, path))
}

pub use mlx_ext::quant::{QuantMode, QuantParams};

/// The two keys a config holds its quantization block under: mlx-lm's
/// `quantization`, which wins, and Hugging Face's `quantization_config`
/// (mlx-lm writes both). Flattened into a typed config
/// (`#[serde(flatten)]`), or read from a config as JSON with
/// [`Quantization::of_config`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct QuantizationKeys {
    #[serde(default)]
    quantization: Option<serde_json::Value>,
    #[serde(default)]
    quantization_config: Option<serde_json::Value>,
}

impl QuantizationKeys {
    /// The block these keys hold, parsed; `path` names the config.
    pub fn parse(&self, path: &Path) -> Result<Quantization, ModelError> {
        Quantization::parse(
            block_of(
                self.quantization.as_ref(),
                self.quantization_config.as_ref(),
            ),
            path,
        )
    }
}

/// The block of the two keys' values: `quantization`'s unless absent or
/// null.
fn block_of<'a>(
    quantization: Option<&'a serde_json::Value>,
    config: Option<&'a serde_json::Value>,
) -> Option<&'a serde_json::Value> {
    let present = |v: &&serde_json::Value| !v.is_null();
    quantization.filter(present).or(config.filter(present))
}

/// mlx-lm's `quantization` block: defaults plus per-module overrides (a
/// module path mapped to its own parameters, or `false` for full precision).
/// Each entry has a `mode` (`affine` when absent, as mlx-lm reads it);
/// an override without `group_size` or `bits` takes its mode's defaults, as
/// `mlx.nn`'s `to_quantized` does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quantization {
    /// Parameters for modules without an override.
    pub default: Option<QuantParams>,
    /// `module path -> Some(params)` or `None` (kept full precision).
    pub overrides: HashMap<String, Option<QuantParams>>,
}

impl Quantization {
    /// The block of `config` (a whole config as JSON) under either key
    /// ([`QuantizationKeys`]), parsed; `path` names the config.
    pub fn of_config(config: &serde_json::Value, path: &Path) -> Result<Self, ModelError> {
        Self::parse(
            block_of(
                config.get("quantization"),
                config.get("quantization_config"),
            ),
            path,
        )
    }

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
        if let Some(q) = Self::hugging_face_mx(obj, path)? {
            return Ok(q);
        }
        let int = |v: &serde_json::Value,
                   key: &str,
                   what: &str|
         -> Result<Option<i32>, ModelError> {
            match v.get(key) {
                None => Ok(None),
                Some(n) => n
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| bad(format!("{what}.{key}: expected an integer, found {n}"))),
            }
        };
        let params =
            |v: &serde_json::Value, what: &str, top: bool| -> Result<QuantParams, ModelError> {
                let mode = match v.get("mode") {
                    None => QuantMode::Affine,
                    Some(m) => m
                        .as_str()
                        .ok_or_else(|| bad(format!("{what}.mode: expected a string, found {m}")))?
                        .parse()
                        .map_err(|e| ModelError::config_parse(path, format!("{what}.mode: "), e))?,
                };
                if v.get("global_scale")
                    .is_some_and(|g| g != &serde_json::Value::Bool(false))
                {
                    return Err(bad(format!(
                        "{what}.global_scale: nvfp4 tensor scales (mlx-lm's switch-layer option) \
                     are not supported: MLX's C API has no global scale for gather_qmm"
                    )));
                }
                let (group_size, bits) = (int(v, "group_size", what)?, int(v, "bits", what)?);
                // mlx-lm's loader reads the top level's two keys unconditionally.
                if top && (group_size.is_none() || bits.is_none()) {
                    let key = if group_size.is_none() {
                        "group_size"
                    } else {
                        "bits"
                    };
                    return Err(bad(format!("{what}: missing {key}")));
                }
                QuantParams::new(mode, group_size, bits)
                    .map_err(|e| ModelError::config_parse(path, format!("{what}: "), e))
            };
        let mut q = Self::default();
        if ["bits", "group_size", "mode"]
            .iter()
            .any(|k| obj.contains_key(*k))
        {
            q.default = Some(params(block, "quantization", true)?);
        }
        for (key, value) in obj {
            match key.as_str() {
                "bits" | "group_size" | "mode" | "quant_method" => {}
                _ if value.is_object() => {
                    let what = format!("quantization.{key}");
                    q.overrides
                        .insert(key.clone(), Some(params(value, &what, false)?));
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

    /// Hugging Face's block of an MX checkpoint (`quant_method` `mxfp4` or
    /// `mxfp8`, no `bits` or `group_size`: gpt-oss as OpenAI ships it), as
    /// mlx-lm's loader reads it: MLX's mode at its only settings, for the
    /// modules stored with scales (what else the block says, such as
    /// `modules_to_not_convert`, the stored tensors say too).
    fn hugging_face_mx(
        obj: &serde_json::Map<String, serde_json::Value>,
        path: &Path,
    ) -> Result<Option<Self>, ModelError> {
        if obj.contains_key("bits") || obj.contains_key("group_size") {
            return Ok(None);
        }
        let (mode, bits) = match obj.get("quant_method").and_then(|m| m.as_str()) {
            Some("mxfp4") => (QuantMode::Mxfp4, 4),
            Some("mxfp8") => (QuantMode::Mxfp8, 8),
            _ => return Ok(None),
        };
        let params = QuantParams::new(mode, Some(32), Some(bits))
            .map_err(|e| ModelError::config_parse(path, "quantization_config: ", e))?;
        Ok(Some(Self {
            default: Some(params),
            overrides: HashMap::new(),
        }))
    }

    /// Whether the config has a quantization block at all.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.overrides.is_empty()
    }

    /// The parameters the block gives the module at `path` (e.g.
    /// `model.layers.0.mlp.up_proj`): its override, else the defaults.
    pub fn for_module(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.get(path) {
            Some(p) => *p,
            None => self.default,
        }
    }

    /// The parameters of module `path`, stored quantized with `in_dim`
    /// unpacked columns as a weight of `weight_columns` packed columns and
    /// scales of `scale_columns` columns and dtype `scales_dtype`, by
    /// mlx-lm's load rule: a module the block names takes its entry (`None`
    /// for `false`); any other is inferred from what is stored
    /// (`infer_quant_config`: group size and bits from the shapes, the mode
    /// from the scales' dtype and that pair), as long as a block exists.
    pub fn resolve(
        &self,
        path: &str,
        in_dim: i32,
        weight_columns: i32,
        scale_columns: i32,
        scales_dtype: mlx_rs::Dtype,
    ) -> Result<Option<QuantParams>, ModelError> {
        let infer_error = |message: String| ModelError::Quantized {
            module: path.to_string(),
            message,
        };
        if let Some(named) = self.overrides.get(path) {
            return Ok(*named);
        }
        if self.is_empty() {
            return Ok(None);
        }
        if scale_columns <= 0 || in_dim % scale_columns != 0 || (weight_columns * 32) % in_dim != 0
        {
            return Err(infer_error(format!(
                "cannot infer its quantization: {in_dim} columns stored as {weight_columns} packed \
                 words with {scale_columns} scales per row"
            )));
        }
        let (group_size, bits) = (in_dim / scale_columns, weight_columns * 32 / in_dim);
        let mode = if scales_dtype != mlx_rs::Dtype::Uint8 {
            QuantMode::Affine
        } else {
            [QuantMode::Nvfp4, QuantMode::Mxfp4, QuantMode::Mxfp8]
                .into_iter()
                .find(|m| m.accepts(group_size, bits))
                .ok_or_else(|| {
                    infer_error(format!(
                        "cannot infer its quantization mode: uint8 scales with {bits} bits and \
                         group size {group_size} fit none of mxfp4, nvfp4, mxfp8"
                    ))
                })?
        };
        QuantParams {
            mode,
            group_size,
            bits,
        }
        .check()
        .map(Some)
        .map_err(|source| ModelError::QuantizedCheck {
            module: path.to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::Dtype;

    use super::*;

    fn params(mode: QuantMode, group_size: i32, bits: i32) -> Option<QuantParams> {
        Some(QuantParams {
            mode,
            group_size,
            bits,
        })
    }

    /// `quantization` wins over `quantization_config`, which serves when
    /// the first is absent or null; typed configs (the keys flattened)
    /// and configs read as JSON agree.
    #[test]
    fn either_key_holds_the_block_and_quantization_wins() {
        #[derive(Deserialize)]
        struct Typed {
            #[allow(dead_code)]
            hidden_size: i32,
            #[serde(flatten)]
            quantization: QuantizationKeys,
        }
        let path = Path::new("config.json");
        let four = serde_json::json!({"group_size": 64, "bits": 4});
        let eight = serde_json::json!({"group_size": 32, "bits": 8});
        let cases = [
            (
                serde_json::json!({"quantization": four, "quantization_config": eight}),
                Some(4),
            ),
            (serde_json::json!({"quantization_config": eight}), Some(8)),
            (
                serde_json::json!({"quantization": null, "quantization_config": eight}),
                Some(8),
            ),
            (serde_json::json!({}), None),
        ];
        for (mut config, bits) in cases {
            let of_json = Quantization::of_config(&config, path).expect("parsed");
            config["hidden_size"] = serde_json::json!(8);
            let typed: Typed = serde_json::from_value(config.clone()).expect("typed");
            let of_typed = typed.quantization.parse(path).expect("parsed");
            assert_eq!(of_json, of_typed, "{config}");
            assert_eq!(of_json.default.map(|p| p.bits), bits, "{config}");
        }
        // A bad block is an error naming the config either way.
        let bad = serde_json::json!({"quantization_config": 3});
        assert!(Quantization::of_config(&bad, path).is_err());
    }

    /// Hugging Face's MX blocks (gpt-oss as OpenAI ships it) read as
    /// mlx-lm reads them: the mode at its settings, the rest ignored; another
    /// `quant_method` without settings stays an error naming its key.
    #[test]
    fn hugging_face_mx_blocks_read_as_mlx_lm_reads_them() {
        let path = Path::new("config.json");
        for (method, bits) in [("mxfp4", 4), ("mxfp8", 8)] {
            let config = serde_json::json!({"quantization_config": {
                "quant_method": method, "modules_to_not_convert": ["lm_head"]}});
            let q = Quantization::of_config(&config, path).expect(method);
            let p = q.default.expect("defaults");
            assert_eq!((p.group_size, p.bits), (32, bits), "{method}");
            assert!(q.overrides.is_empty());
        }
        let fp8 = serde_json::json!({"quantization_config": {
            "quant_method": "fp8", "weight_block_size": [128, 128]}});
        let err = Quantization::of_config(&fp8, path)
            .expect_err("fp8")
            .to_string();
        assert!(err.contains("weight_block_size"), "{err}");
    }

    #[test]
    fn quantization_block_with_modes_and_overrides() {
        let block = serde_json::json!({
            "group_size": 32, "bits": 4, "mode": "mxfp4",
            "model.layers.0.mlp.down_proj": {"mode": "mxfp8"},
            "model.layers.0.self_attn.v_proj": {"group_size": 16, "bits": 4, "mode": "nvfp4"},
            "model.embed_tokens": {"group_size": 64, "bits": 6},
            "lm_head": false
        });
        let q = Quantization::parse(Some(&block), Path::new("config.json")).expect("parse");
        let check = |module: &str, expected| assert_eq!(q.for_module(module), expected, "{module}");
        check(
            "model.layers.1.mlp.up_proj",
            params(QuantMode::Mxfp4, 32, 4),
        );
        // An override without group size and bits takes its mode's defaults.
        check(
            "model.layers.0.mlp.down_proj",
            params(QuantMode::Mxfp8, 32, 8),
        );
        check(
            "model.layers.0.self_attn.v_proj",
            params(QuantMode::Nvfp4, 16, 4),
        );
        // No mode: affine, as mlx-lm reads it.
        check("model.embed_tokens", params(QuantMode::Affine, 64, 6));
        check("lm_head", None);
        let affine = serde_json::json!({"group_size": 64, "bits": 4});
        let q = Quantization::parse(Some(&affine), Path::new("config.json")).expect("parse");
        assert_eq!(q.for_module("x"), params(QuantMode::Affine, 64, 4));
    }

    #[test]
    fn bad_quantization_values_name_the_key() {
        for (block, needles) in [
            (
                serde_json::json!({"group_size": 64, "bits": 7}),
                &["quantization:", "7 bits"][..],
            ),
            (
                serde_json::json!({"group_size": 48, "bits": 4}),
                &["group size 48"],
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4, "x": 3}),
                &["quantization.x"],
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4, "mode": "mxfp6"}),
                &["quantization.mode", "unknown quantization mode `mxfp6`"],
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4, "mode": "mxfp4"}),
                &[
                    "quantization:",
                    "mxfp4",
                    "group size 64",
                    "group size 32 with 4 bits only",
                ],
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4,
                    "model.layers.0.mlp.up_proj": {"group_size": 32, "bits": 4, "mode": "nvfp4"}}),
                &[
                    "quantization.model.layers.0.mlp.up_proj",
                    "nvfp4",
                    "group size 32",
                ],
            ),
            (
                serde_json::json!({"group_size": 64, "bits": 4,
                    "model.layers.0.mlp.switch_mlp.up_proj": {"group_size": 16, "bits": 4,
                        "mode": "nvfp4", "global_scale": true}}),
                &["quantization.model.layers.0.mlp.switch_mlp.up_proj.global_scale"],
            ),
            (
                serde_json::json!({"mode": "mxfp8", "bits": 8}),
                &["missing group_size"],
            ),
            (
                serde_json::json!({"group_size": "64", "bits": 4}),
                &["quantization.group_size: expected an integer"],
            ),
        ] {
            let err = Quantization::parse(Some(&block), Path::new("c.json"))
                .expect_err("must fail")
                .to_string();
            for needle in needles {
                assert!(err.contains(needle), "{needle}: {err}");
            }
        }
    }

    /// mlx-lm's `infer_quant_config`: modules the block does not name are
    /// read from the stored shapes and the scales' dtype.
    #[test]
    fn unnamed_modules_are_inferred_from_what_is_stored() {
        let block = serde_json::json!({"group_size": 64, "bits": 4, "mode": "affine",
            "named": {"group_size": 32, "bits": 8}, "off": false});
        let q = Quantization::parse(Some(&block), Path::new("c.json")).expect("parse");
        let resolve = |module, weight_cols, scale_cols, dtype| {
            q.resolve(module, 64, weight_cols, scale_cols, dtype)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            resolve("named", 1, 1, Dtype::Uint8),
            Ok(params(QuantMode::Affine, 32, 8))
        );
        assert_eq!(resolve("off", 8, 1, Dtype::Float32), Ok(None));
        assert_eq!(
            resolve("a", 8, 1, Dtype::Bfloat16),
            Ok(params(QuantMode::Affine, 64, 4))
        );
        assert_eq!(
            resolve("a", 16, 2, Dtype::Float16),
            Ok(params(QuantMode::Affine, 32, 8))
        );
        assert_eq!(
            resolve("a", 8, 2, Dtype::Uint8),
            Ok(params(QuantMode::Mxfp4, 32, 4))
        );
        assert_eq!(
            resolve("a", 8, 4, Dtype::Uint8),
            Ok(params(QuantMode::Nvfp4, 16, 4))
        );
        assert_eq!(
            resolve("a", 16, 2, Dtype::Uint8),
            Ok(params(QuantMode::Mxfp8, 32, 8))
        );
        let err = resolve("a", 8, 1, Dtype::Uint8).expect_err("uint8 scales, group 64");
        assert!(err.contains("fit none of"), "{err}");
        let err = q
            .resolve("a", 64, 8, 4, Dtype::Float32)
            .expect_err("affine group 16");
        assert!(
            matches!(&err, ModelError::QuantizedCheck { module, .. } if module == "a"),
            "{err}"
        );
        assert!(err.to_string().contains("group size 16"), "{err}");
        let err = resolve("a", 7, 3, Dtype::Float32).expect_err("not whole");
        assert!(err.contains("cannot infer"), "{err}");
        let none = Quantization::default();
        assert!(matches!(
            none.resolve("a", 64, 8, 1, Dtype::Float32),
            Ok(None)
        ));
    }
}
