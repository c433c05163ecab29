//! `config.json` of a Gemma-4 assistant checkpoint (`gemma4_assistant`, or
//! `gemma4_unified_assistant` for the 12B one): the top-level drafter keys
//! (`backbone_hidden_size`, the centroid head) and a `text_config` for the
//! four Q-only blocks. Defaults are optiq 0.7.7's where it has one; values we
//! would mis-handle are errors naming the key.

use std::path::Path;

use serde_json::Value;

use crate::AssistantError;

/// `model_type`s this crate loads.
pub const MODEL_TYPES: &[&str] = &["gemma4_assistant", "gemma4_unified_assistant"];

/// Attention kind of one drafter block; it reads the donor of the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// `sliding_attention`: reads the target's last sliding donor.
    Sliding,
    /// `full_attention`: reads the target's last full donor.
    Full,
}

impl LayerKind {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "sliding_attention" => Some(Self::Sliding),
            "full_attention" => Some(Self::Full),
            _ => None,
        }
    }
}

/// The centroid ("ordered embeddings") output head's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CentroidHead {
    /// Centroids (2048 on the released drafters).
    pub centroids: i32,
    /// Centroids kept per step (32).
    pub top_k: i32,
    /// Tokens per centroid (`vocab / centroids`).
    pub per_centroid: i32,
}

/// The output head a checkpoint carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// Logits over the whole vocabulary from the drafter's embedding table.
    Tied,
    /// An `lm_head` of its own.
    Untied,
    /// Top centroids, then their tokens via `token_ordering`.
    Centroid(CentroidHead),
}

/// A validated assistant configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantConfig {
    /// The checkpoint's `model_type`.
    pub model_type: String,
    /// Hidden width of the target it drafts for.
    pub backbone_hidden: i32,
    /// The drafter's own hidden width.
    pub hidden: i32,
    /// MLP inner width.
    pub intermediate: i32,
    /// Query heads.
    pub heads: i32,
    /// Key/value heads of the donors (the query heads are grouped over them).
    pub kv_heads: i32,
    /// Head width of sliding blocks.
    pub head_dim: i32,
    /// Head width of full blocks.
    pub global_head_dim: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// One kind per block.
    pub layers: Vec<LayerKind>,
    /// Sliding window the sliding blocks mask to.
    pub sliding_window: usize,
    /// Vocabulary size.
    pub vocab: i32,
    /// RoPE base of sliding blocks.
    pub rope_theta_sliding: f32,
    /// RoPE base of full blocks.
    pub rope_theta_full: f32,
    /// Fraction of a full block's head that rotates (proportional RoPE).
    pub full_partial_rotary_factor: f32,
    /// Output head.
    pub head: HeadKind,
}

fn int(obj: &Value, key: &str) -> Option<i64> {
    obj.get(key).and_then(Value::as_i64)
}

fn float(obj: &Value, key: &str) -> Option<f64> {
    obj.get(key).and_then(Value::as_f64)
}

impl AssistantConfig {
    /// Reads and validates `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, AssistantError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| AssistantError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value =
            serde_json::from_str(&text).map_err(|source| AssistantError::ConfigJson {
                path: path.clone(),
                source,
            })?;
        Self::parse(&value, &path)
    }

    /// Validates a parsed config; `path` names the file in errors.
    pub fn parse(cfg: &Value, path: &Path) -> Result<Self, AssistantError> {
        let bad = |message: String| AssistantError::Config {
            path: path.to_path_buf(),
            message,
        };
        let model_type = cfg
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing `model_type`".into()))?;
        if !MODEL_TYPES.contains(&model_type) {
            return Err(AssistantError::NotAnAssistant {
                path: path.to_path_buf(),
                model_type: model_type.to_owned(),
            });
        }
        let tc = cfg
            .get("text_config")
            .filter(|v| v.is_object())
            .ok_or_else(|| bad("missing `text_config` object".into()))?;
        let positive =
            |obj: &Value, key: &str, default: Option<i64>| -> Result<i32, AssistantError> {
                if obj.get(key).is_some_and(|v| !v.is_null() && !v.is_i64()) {
                    return Err(bad(format!("`{key}` = {} must be an integer", obj[key])));
                }
                let v = match int(obj, key).or(default) {
                    Some(v) => v,
                    None => return Err(bad(format!("missing `{key}`"))),
                };
                i32::try_from(v)
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| bad(format!("`{key}` = {v} must be a positive integer")))
            };
        // optiq also looks in text_config; there is no safe default.
        let top = if cfg.get("backbone_hidden_size").is_some() {
            cfg
        } else {
            tc
        };
        let backbone_hidden = positive(top, "backbone_hidden_size", None)?;
        let hidden = positive(tc, "hidden_size", Some(256))?;
        let intermediate = positive(tc, "intermediate_size", Some(2048))?;
        let heads = positive(tc, "num_attention_heads", Some(4))?;
        let kv_heads = positive(tc, "num_key_value_heads", Some(2))?;
        let head_dim = positive(tc, "head_dim", Some(256))?;
        let global_head_dim = match tc.get("global_head_dim").filter(|v| !v.is_null()) {
            Some(_) => positive(tc, "global_head_dim", None)?,
            None => head_dim,
        };
        if heads % kv_heads != 0 {
            return Err(bad(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let eps = float(tc, "rms_norm_eps").unwrap_or(1e-6) as f32;
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(bad(format!("`rms_norm_eps` = {eps} must be positive")));
        }
        let names = tc
            .get("layer_types")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("missing `layer_types` list".into()))?;
        let layers = names
            .iter()
            .map(|n| {
                n.as_str().and_then(LayerKind::parse).ok_or_else(|| {
                    bad(format!(
                        "layer type {n} is neither sliding_attention nor full_attention"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let declared = int(tc, "num_hidden_layers").map_or(layers.len(), |n| n.max(0) as usize);
        if layers.is_empty() || declared != layers.len() {
            return Err(bad(format!(
                "num_hidden_layers {declared} does not match {} layer_types",
                layers.len()
            )));
        }
        let sliding_window = positive(tc, "sliding_window", Some(512))? as usize;
        let vocab = positive(tc, "vocab_size", Some(262_144))?;
        let rope = tc.get("rope_parameters").cloned().unwrap_or(Value::Null);
        let theta = |kind: &str, default: f64| -> Result<f32, AssistantError> {
            let v = rope
                .get(kind)
                .and_then(|p| float(p, "rope_theta"))
                .unwrap_or(default);
            if v > 0.0 && v.is_finite() {
                Ok(v as f32)
            } else {
                Err(bad(format!(
                    "rope_parameters.{kind}.rope_theta = {v} must be positive"
                )))
            }
        };
        let rope_theta_sliding = theta("sliding_attention", 10_000.0)?;
        let rope_theta_full = theta("full_attention", 1_000_000.0)?;
        let factor = rope
            .get("full_attention")
            .and_then(|p| float(p, "partial_rotary_factor"))
            .unwrap_or(1.0);
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(bad(format!(
                "rope_parameters.full_attention.partial_rotary_factor = {factor} must be in (0, 1]"
            )));
        }
        let rotated = (f64::from(global_head_dim) * factor) as i32;
        if rotated % 2 != 0 {
            return Err(bad(format!(
                "full blocks rotate {rotated} of {global_head_dim} dimensions: not an even count"
            )));
        }
        let tied = cfg
            .get("tie_word_embeddings")
            .or_else(|| tc.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let centroids = int(cfg, "num_centroids").unwrap_or(0);
        let top_k = int(cfg, "centroid_intermediate_top_k").unwrap_or(0);
        // The flag decides; the 12B assistant carries centroid counts but no
        // centroid tensors and says `use_ordered_embeddings: false`.
        let ordered = cfg
            .get("use_ordered_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(centroids > 0 && top_k > 0);
        let head = if ordered {
            let c = positive(cfg, "num_centroids", None)?;
            let k = positive(cfg, "centroid_intermediate_top_k", None)?;
            if k > c {
                return Err(bad(format!(
                    "centroid_intermediate_top_k {k} exceeds num_centroids {c}"
                )));
            }
            if vocab % c != 0 {
                return Err(bad(format!(
                    "vocab_size {vocab} is not a multiple of num_centroids {c}"
                )));
            }
            HeadKind::Centroid(CentroidHead {
                centroids: c,
                top_k: k,
                per_centroid: vocab / c,
            })
        } else if tied {
            HeadKind::Tied
        } else {
            HeadKind::Untied
        };
        Ok(Self {
            model_type: model_type.to_owned(),
            backbone_hidden,
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            global_head_dim,
            eps,
            layers,
            sliding_window,
            vocab,
            rope_theta_sliding,
            rope_theta_full,
            full_partial_rotary_factor: factor as f32,
            head,
        })
    }

    /// Head width of a block of `kind`.
    pub fn head_dim_of(&self, kind: LayerKind) -> i32 {
        match kind {
            LayerKind::Sliding => self.head_dim,
            LayerKind::Full => self.global_head_dim,
        }
    }

    /// Whether any block reads a donor of `kind`.
    pub fn uses(&self, kind: LayerKind) -> bool {
        self.layers.contains(&kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "model_type": "gemma4_assistant",
            "backbone_hidden_size": 2560,
            "use_ordered_embeddings": true,
            "num_centroids": 2048,
            "centroid_intermediate_top_k": 32,
            "tie_word_embeddings": true,
            "text_config": {
                "hidden_size": 256, "intermediate_size": 2048, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512,
                "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                "sliding_window": 512, "vocab_size": 262144,
                "rope_parameters": {
                    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
                }
            }
        })
    }

    fn parse(v: &Value) -> Result<AssistantConfig, AssistantError> {
        AssistantConfig::parse(v, Path::new("config.json"))
    }

    fn error(edit: impl FnOnce(&mut Value)) -> String {
        let mut v = base();
        edit(&mut v);
        parse(&v).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn the_e4b_assistant_config_parses_as_the_notes_describe() {
        let c = parse(&base()).expect("parse");
        assert_eq!(
            (
                c.backbone_hidden,
                c.hidden,
                c.heads,
                c.kv_heads,
                c.head_dim,
                c.global_head_dim
            ),
            (2560, 256, 4, 2, 256, 512)
        );
        assert_eq!(
            c.layers,
            [
                LayerKind::Sliding,
                LayerKind::Sliding,
                LayerKind::Sliding,
                LayerKind::Full
            ]
        );
        assert_eq!(
            c.head,
            HeadKind::Centroid(CentroidHead {
                centroids: 2048,
                top_k: 32,
                per_centroid: 128
            })
        );
        assert_eq!(
            (
                c.rope_theta_full,
                c.rope_theta_sliding,
                c.full_partial_rotary_factor
            ),
            (1e6, 1e4, 0.25)
        );
        assert_eq!(c.head_dim_of(LayerKind::Full), 512);
    }

    #[test]
    fn the_flag_not_the_counts_picks_the_centroid_head() {
        // The 12B assistant carries centroid counts but no centroid tensors.
        let mut v = base();
        v["model_type"] = "gemma4_unified_assistant".into();
        v["use_ordered_embeddings"] = false.into();
        assert_eq!(parse(&v).expect("parse").head, HeadKind::Tied);
        v["tie_word_embeddings"] = false.into();
        assert_eq!(parse(&v).expect("parse").head, HeadKind::Untied);
    }

    #[test]
    fn impossible_configs_name_the_problem() {
        assert!(
            error(|v| v["model_type"] = "gemma4_text".into()).contains("not a Gemma-4 assistant")
        );
        assert!(
            error(|v| drop(v.as_object_mut().map(|o| o.remove("backbone_hidden_size"))))
                .contains("backbone_hidden_size")
        );
        assert!(
            error(|v| drop(v.as_object_mut().map(|o| o.remove("text_config"))))
                .contains("text_config")
        );
        assert!(
            error(|v| v["text_config"]["layer_types"][1] = "local".into())
                .contains("neither sliding_attention")
        );
        assert!(error(|v| v["text_config"]["num_hidden_layers"] = 3.into())
            .contains("num_hidden_layers 3"));
        assert!(
            error(|v| v["text_config"]["num_key_value_heads"] = 3.into())
                .contains("not a multiple of num_key_value_heads")
        );
        assert!(
            error(|v| v["text_config"]["hidden_size"] = (-4).into()).contains("`hidden_size` = -4")
        );
        assert!(error(|v| v["text_config"]["head_dim"] = "256".into())
            .contains("`head_dim` = \"256\" must be an integer"));
        assert!(error(|v| v["centroid_intermediate_top_k"] = 4096.into())
            .contains("exceeds num_centroids"));
        assert!(
            error(|v| v["num_centroids"] = 3000.into()).contains("not a multiple of num_centroids")
        );
        assert!(
            error(|v| v["text_config"]["rope_parameters"]["full_attention"]
                ["partial_rotary_factor"] = 1.5.into())
            .contains("partial_rotary_factor")
        );
        assert!(
            error(|v| v["text_config"]["rope_parameters"]["full_attention"]
                ["partial_rotary_factor"] = (1.0 / 512.0).into())
            .contains("not an even count")
        );
    }
}
