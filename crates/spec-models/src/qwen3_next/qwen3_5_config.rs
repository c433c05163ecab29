//! `config.json` of `qwen3_5` as mlx-lm 0.32.2's `qwen3_5.py` reads it: the
//! text model's keys under `text_config` (multimodal checkpoints) or at the
//! top level, with mlx-lm's defaults for absent keys; the RoPE comes from
//! `rope_parameters` (its `rope_theta` and `partial_rotary_factor`, the
//! top-level ones ignored while it is given, as mlx-lm's `__post_init__`
//! does); the layer pattern from `full_attention_interval` or, in a config
//! transformers saved, `layer_types` (`layer_pattern`). The quantization
//! block sits at the top level.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::config::{validate, Config, Layout, Raw};
use crate::config::QuantizationKeys;
use crate::rope::Rope;
use crate::ModelError;

/// The top level: the text model's keys, or a wrapper's `text_config`.
#[derive(Debug, Deserialize)]
pub(super) struct ConfigFile {
    model_type: String,
    text_config: Option<Value>,
    // mlx-lm writes the block under both names; `quantization` wins.
    #[serde(flatten)]
    quantization: QuantizationKeys,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// The keys `qwen3_5.TextModelArgs` reads; defaults are mlx-lm's.
#[derive(Debug, Deserialize)]
struct TextConfig {
    #[serde(default = "d::hidden_size")]
    hidden_size: i32,
    #[serde(default = "d::intermediate_size")]
    intermediate_size: i32,
    #[serde(default = "d::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "d::num_attention_heads")]
    num_attention_heads: i32,
    #[serde(default = "d::rms_norm_eps")]
    rms_norm_eps: f32,
    #[serde(default = "d::vocab_size")]
    vocab_size: i32,
    #[serde(default = "d::num_key_value_heads")]
    num_key_value_heads: i32,
    #[serde(default = "d::max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "d::linear_num_value_heads")]
    linear_num_value_heads: i32,
    #[serde(default = "d::linear_num_key_heads")]
    linear_num_key_heads: i32,
    #[serde(default = "d::linear_key_head_dim")]
    linear_key_head_dim: i32,
    #[serde(default = "d::linear_value_head_dim")]
    linear_value_head_dim: i32,
    #[serde(default = "d::linear_conv_kernel_dim")]
    linear_conv_kernel_dim: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    head_dim: Option<i32>,
    #[serde(default)]
    full_attention_interval: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    num_experts: usize,
    #[serde(default)]
    num_experts_per_tok: i32,
    #[serde(default)]
    moe_intermediate_size: i32,
    #[serde(default)]
    shared_expert_intermediate_size: i32,
    #[serde(default = "d::norm_topk_prob")]
    norm_topk_prob: bool,
    /// Absent: mlx-lm's default parameters; `null`: none (the top-level
    /// keys then count).
    #[serde(default = "d::rope_parameters")]
    rope_parameters: Option<Value>,
    #[serde(default = "d::partial_rotary_factor")]
    partial_rotary_factor: f32,
    #[serde(default = "d::rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_scaling: Option<Value>,
}

/// mlx-lm 0.32.2's `TextModelArgs` defaults.
mod d {
    use super::{json, Value};
    pub fn hidden_size() -> i32 {
        4096
    }
    pub fn intermediate_size() -> i32 {
        14336
    }
    pub fn num_hidden_layers() -> usize {
        32
    }
    pub fn num_attention_heads() -> i32 {
        32
    }
    pub fn rms_norm_eps() -> f32 {
        1e-6
    }
    pub fn vocab_size() -> i32 {
        151_936
    }
    pub fn num_key_value_heads() -> i32 {
        8
    }
    pub fn max_position_embeddings() -> usize {
        131_072
    }
    pub fn linear_num_value_heads() -> i32 {
        64
    }
    pub fn linear_num_key_heads() -> i32 {
        16
    }
    pub fn linear_key_head_dim() -> i32 {
        192
    }
    pub fn linear_value_head_dim() -> i32 {
        128
    }
    pub fn linear_conv_kernel_dim() -> i32 {
        4
    }
    pub fn norm_topk_prob() -> bool {
        true
    }
    pub fn rope_parameters() -> Option<Value> {
        Some(json!({
            "type": "default",
            "mrope_section": [11, 11, 10],
            "rope_theta": 100000,
            "partial_rotary_factor": 0.25,
        }))
    }
    pub fn partial_rotary_factor() -> f32 {
        0.25
    }
    pub fn rope_theta() -> f32 {
        100_000.0
    }
}

/// Parses and checks a `qwen3_5` config; `path` names it in errors.
pub(super) fn parse(c: ConfigFile, path: &Path) -> Result<(Config, Rope), ModelError> {
    let text = match c.text_config {
        Some(t) => t,
        None => Value::Object(c.rest),
    };
    let t: TextConfig = serde_json::from_value(text)
        .map_err(|e| ModelError::config_parse(path, "text_config: ", e))?;
    // `__post_init__`: a non-empty `rope_parameters` supplies the RoPE.
    let params = t
        .rope_parameters
        .filter(|p| p.as_object().is_some_and(|m| !m.is_empty()));
    let (rope_theta, partial_rotary_factor, rope_scaling) = match params {
        Some(p) => {
            let num = |key: &str, default: f64| {
                p.get(key).and_then(Value::as_f64).unwrap_or(default) as f32
            };
            (
                num("rope_theta", 100_000.0),
                num("partial_rotary_factor", 0.25),
                Some(p),
            )
        }
        None => (t.rope_theta, t.partial_rotary_factor, t.rope_scaling),
    };
    let head_dim = match t.head_dim {
        Some(d) => d,
        None if t.num_attention_heads > 0 => t.hidden_size / t.num_attention_heads,
        None => 0,
    };
    let quantization = c.quantization.parse(path)?;
    let full_attention_interval = super::layer_pattern::interval(
        t.layer_types.as_deref(),
        t.full_attention_interval,
        t.num_hidden_layers,
        path,
    )?;
    let raw = Raw {
        model_type: c.model_type,
        layout: Layout::Split,
        hidden_size: t.hidden_size,
        num_hidden_layers: t.num_hidden_layers,
        intermediate_size: t.intermediate_size,
        num_attention_heads: t.num_attention_heads,
        num_key_value_heads: t.num_key_value_heads,
        head_dim,
        linear_num_value_heads: t.linear_num_value_heads,
        linear_num_key_heads: t.linear_num_key_heads,
        linear_key_head_dim: t.linear_key_head_dim,
        linear_value_head_dim: t.linear_value_head_dim,
        linear_conv_kernel_dim: t.linear_conv_kernel_dim,
        // mlx-lm: every layer is an expert block once experts exist.
        sparse: vec![t.num_experts > 0; t.num_hidden_layers],
        num_experts: t.num_experts,
        num_experts_per_tok: t.num_experts_per_tok,
        moe_intermediate_size: t.moe_intermediate_size,
        shared_expert_intermediate_size: t.shared_expert_intermediate_size,
        norm_topk_prob: t.norm_topk_prob,
        rms_norm_eps: t.rms_norm_eps,
        vocab_size: t.vocab_size,
        rope_theta,
        partial_rotary_factor,
        rope_scaling,
        max_position_embeddings: t.max_position_embeddings,
        tie_word_embeddings: t.tie_word_embeddings,
        attention_bias: t.attention_bias,
        full_attention_interval,
    };
    validate(raw, quantization, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(v: Value) -> Result<(Config, Rope), ModelError> {
        let file: ConfigFile = serde_json::from_value(v).map_err(|e| ModelError::Config {
            path: "config.json".into(),
            message: e.to_string(),
        })?;
        parse(file, Path::new("config.json"))
    }

    fn text() -> Value {
        json!({
            "hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 48,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "linear_num_value_heads": 4, "linear_num_key_heads": 2,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "vocab_size": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
        })
    }

    #[test]
    fn a_wrapper_and_a_flat_config_read_the_same_text_model() {
        let (wrapped, _) =
            parsed(json!({"model_type": "qwen3_5", "text_config": text()})).expect("wrapper");
        let mut flat = text();
        flat["model_type"] = json!("qwen3_5");
        let (flat, _) = parsed(flat).expect("flat");
        assert_eq!(wrapped.mixers, flat.mixers);
        assert_eq!(wrapped.linear, flat.linear);
        assert_eq!(wrapped.layout, Layout::Split);
        assert_eq!(wrapped.context_length, 131_072, "mlx-lm's default");
    }

    #[test]
    fn rope_parameters_give_the_rotary_and_bad_keys_are_named() {
        let mut t = text();
        t["rope_parameters"]["partial_rotary_factor"] = json!(0.1);
        let e = parsed(json!({"model_type": "qwen3_5", "text_config": t}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("partial_rotary_factor"), "{e}");
        let mut t = text();
        t["num_experts"] = json!(8);
        let e = parsed(json!({"model_type": "qwen3_5_moe", "text_config": t}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("num_experts_per_tok"), "{e}");
        t["num_experts_per_tok"] = json!(2);
        t["moe_intermediate_size"] = json!(16);
        t["shared_expert_intermediate_size"] = json!(16);
        let (c, _) = parsed(json!({"model_type": "qwen3_5_moe", "text_config": t})).expect("moe");
        assert!(c.sparse.iter().all(|&s| s), "every layer");
        assert!(c.moe.is_some_and(|m| m.norm_topk_prob), "qwen3_5's default");
        let mut t = text();
        t["linear_conv_kernel_dim"] = json!("four");
        let e = parsed(json!({"model_type": "qwen3_5", "text_config": t}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("text_config") && e.contains("invalid type"),
            "{e}"
        );
    }
}
