//! `config.json` of `qwen3_next` as mlx-lm 0.32.2's `qwen3_next.ModelArgs`
//! reads it (the keys it requires are required here too), validated into
//! [`Config`]: the layer pattern (`full_attention_interval`), the Gated
//! DeltaNet head geometry (`linear_*`), the conv kernel, the full attention
//! heads and their partial rotary. `validate` holds the checks `qwen3_5`'s
//! config (`qwen3_5_config`) shares.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config::Quantization;
use crate::rope::Rope;
use crate::ModelError;

/// The keys `qwen3_next.ModelArgs` reads (those without a default there are
/// required here).
#[derive(Debug, Deserialize)]
pub(super) struct ConfigFile {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: usize,
    intermediate_size: i32,
    num_attention_heads: i32,
    linear_num_value_heads: i32,
    linear_num_key_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    linear_conv_kernel_dim: i32,
    num_experts: usize,
    // Required by mlx-lm; read once mixture-of-experts layers land.
    #[serde(rename = "num_experts_per_tok")]
    _num_experts_per_tok: usize,
    decoder_sparse_step: usize,
    // Required by mlx-lm; read once mixture-of-experts layers land.
    #[serde(rename = "shared_expert_intermediate_size")]
    _shared_expert_intermediate_size: i32,
    mlp_only_layers: Vec<usize>,
    // Required by mlx-lm; read once mixture-of-experts layers land.
    #[serde(rename = "moe_intermediate_size")]
    _moe_intermediate_size: i32,
    rms_norm_eps: f32,
    vocab_size: i32,
    num_key_value_heads: i32,
    rope_theta: f32,
    partial_rotary_factor: f32,
    max_position_embeddings: usize,
    head_dim: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    rope_scaling: Option<Value>,
    #[serde(default = "default_interval")]
    full_attention_interval: usize,
    // mlx-lm writes the block under both names; `quantization` wins.
    quantization: Option<Value>,
    quantization_config: Option<Value>,
}

fn default_interval() -> usize {
    4
}

/// How the checkpoint lays out a Gated DeltaNet layer's input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `qwen3_next`: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Fused,
    /// `qwen3_5`: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split,
}

/// What a decoder layer mixes its tokens with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Gated DeltaNet linear attention (a conv state and a recurrent state).
    Linear,
    /// Gated full attention over a key/value cache.
    Full,
}

/// The Gated DeltaNet geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearGeometry {
    /// `linear_num_key_heads`.
    pub key_heads: i32,
    /// `linear_num_value_heads` (a multiple of the key heads).
    pub value_heads: i32,
    /// `linear_key_head_dim`.
    pub key_dim: i32,
    /// `linear_value_head_dim`.
    pub value_dim: i32,
    /// `linear_conv_kernel_dim` (at least 2: the conv state keeps
    /// `kernel - 1` positions).
    pub kernel: i32,
}

impl LinearGeometry {
    /// Width of the queries, keys or values of all key heads.
    pub fn keys_width(&self) -> i32 {
        self.key_heads * self.key_dim
    }

    /// Width of the values of all value heads.
    pub fn values_width(&self) -> i32 {
        self.value_heads * self.value_dim
    }

    /// Channels of the causal conv: queries, keys and values.
    pub fn conv_channels(&self) -> i32 {
        2 * self.keys_width() + self.values_width()
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Checkpoint architecture.
    pub model_type: String,
    /// The Gated DeltaNet projections' layout.
    pub layout: Layout,
    /// Hidden width.
    pub hidden: i32,
    /// Each layer's token mixer, in order.
    pub mixers: Vec<Mixer>,
    /// MLP width.
    pub intermediate: i32,
    /// Full attention query heads.
    pub heads: i32,
    /// Full attention key/value heads.
    pub kv_heads: i32,
    /// Full attention per-head width.
    pub head_dim: i32,
    /// Biases on the full attention projections.
    pub attention_bias: bool,
    /// Gated DeltaNet geometry.
    pub linear: LinearGeometry,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Vocabulary size.
    pub vocab: i32,
    /// Output head shares the embedding table.
    pub tied: bool,
    /// Quantization block.
    pub quantization: Quantization,
    /// `max_position_embeddings`.
    pub context_length: usize,
}

/// The values every variant's config gives, before the checks.
#[derive(Debug)]
pub(super) struct Raw {
    pub model_type: String,
    pub layout: Layout,
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    /// The first layer that would be a mixture-of-experts block, if any.
    pub moe_layer: Option<usize>,
    pub num_experts: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub rope_theta: f32,
    pub partial_rotary_factor: f32,
    pub rope_scaling: Option<Value>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub full_attention_interval: usize,
}

/// Parses and checks a `qwen3_next` config; `path` names it in errors.
pub(super) fn parse(c: ConfigFile, path: &Path) -> Result<(Config, Rope), ModelError> {
    if let Some(&i) = c
        .mlp_only_layers
        .iter()
        .find(|&&i| i >= c.num_hidden_layers)
    {
        return Err(ModelError::Config {
            path: path.to_path_buf(),
            message: format!(
                "mlp_only_layers names layer {i} of {} layers",
                c.num_hidden_layers
            ),
        });
    }
    // mlx-lm: an expert block where the layer is not MLP-only, experts
    // exist and (i + 1) is a multiple of `decoder_sparse_step`.
    let moe_layer = (0..c.num_hidden_layers).find(|i| {
        !c.mlp_only_layers.contains(i)
            && c.num_experts > 0
            && (c.decoder_sparse_step == 0 || (i + 1) % c.decoder_sparse_step == 0)
    });
    let quantization = Quantization::parse(
        c.quantization.as_ref().or(c.quantization_config.as_ref()),
        path,
    )?;
    let raw = Raw {
        model_type: c.model_type,
        layout: Layout::Fused,
        hidden_size: c.hidden_size,
        num_hidden_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size,
        num_attention_heads: c.num_attention_heads,
        num_key_value_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        linear_num_value_heads: c.linear_num_value_heads,
        linear_num_key_heads: c.linear_num_key_heads,
        linear_key_head_dim: c.linear_key_head_dim,
        linear_value_head_dim: c.linear_value_head_dim,
        linear_conv_kernel_dim: c.linear_conv_kernel_dim,
        moe_layer,
        num_experts: c.num_experts,
        rms_norm_eps: c.rms_norm_eps,
        vocab_size: c.vocab_size,
        rope_theta: c.rope_theta,
        partial_rotary_factor: c.partial_rotary_factor,
        rope_scaling: c.rope_scaling,
        max_position_embeddings: c.max_position_embeddings,
        tie_word_embeddings: c.tie_word_embeddings,
        attention_bias: c.attention_bias,
        full_attention_interval: c.full_attention_interval,
    };
    validate(raw, quantization, path)
}

/// Checks `c` (either variant's) into a [`Config`] and its RoPE.
pub(super) fn validate(
    c: Raw,
    quantization: Quantization,
    path: &Path,
) -> Result<(Config, Rope), ModelError> {
    let bad = |message: String| ModelError::Config {
        path: path.to_path_buf(),
        message,
    };
    for (name, v) in [
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("vocab_size", c.vocab_size),
        ("linear_num_value_heads", c.linear_num_value_heads),
        ("linear_num_key_heads", c.linear_num_key_heads),
        ("linear_key_head_dim", c.linear_key_head_dim),
        ("linear_value_head_dim", c.linear_value_head_dim),
    ] {
        if v <= 0 {
            return Err(bad(format!("{name} must be positive, got {v}")));
        }
    }
    if c.num_hidden_layers == 0 {
        return Err(bad("num_hidden_layers must be positive".into()));
    }
    if c.full_attention_interval == 0 {
        return Err(bad(
            "full_attention_interval must be positive (every n-th layer is full attention)".into(),
        ));
    }
    if c.linear_num_value_heads % c.linear_num_key_heads != 0 {
        return Err(bad(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            c.linear_num_value_heads, c.linear_num_key_heads
        )));
    }
    if c.linear_conv_kernel_dim < 2 {
        return Err(bad(format!(
            "linear_conv_kernel_dim must be at least 2 (the conv state keeps kernel - 1 positions), got {}",
            c.linear_conv_kernel_dim
        )));
    }
    if c.num_attention_heads % c.num_key_value_heads != 0 {
        return Err(bad(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            c.num_attention_heads, c.num_key_value_heads
        )));
    }
    if !(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0) {
        return Err(bad(format!(
            "partial_rotary_factor must lie in (0, 1], got {}",
            c.partial_rotary_factor
        )));
    }
    // mlx-lm: int(head_dim * partial_rotary_factor), in Python's doubles.
    let rotary = (f64::from(c.head_dim) * f64::from(c.partial_rotary_factor)) as i32;
    if rotary < 2 || rotary % 2 != 0 {
        return Err(bad(format!(
            "head_dim {} times partial_rotary_factor {} gives {rotary} rotary dimensions: it must be even and at least 2",
            c.head_dim, c.partial_rotary_factor
        )));
    }
    if let Some(i) = c.moe_layer {
        return Err(bad(format!(
            "num_experts {}: layer {i} would be a mixture-of-experts block, which {} does not implement yet (dense MLP layers only)",
            c.num_experts, c.model_type
        )));
    }
    let mixers = (0..c.num_hidden_layers)
        .map(|i| {
            if (i + 1) % c.full_attention_interval == 0 {
                Mixer::Full
            } else {
                Mixer::Linear
            }
        })
        .collect();
    let rope = Rope::new(rotary, c.rope_theta, false, c.rope_scaling.as_ref(), path)?;
    let config = Config {
        model_type: c.model_type,
        layout: c.layout,
        hidden: c.hidden_size,
        mixers,
        intermediate: c.intermediate_size,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        attention_bias: c.attention_bias,
        linear: LinearGeometry {
            key_heads: c.linear_num_key_heads,
            value_heads: c.linear_num_value_heads,
            key_dim: c.linear_key_head_dim,
            value_dim: c.linear_value_head_dim,
            kernel: c.linear_conv_kernel_dim,
        },
        eps: c.rms_norm_eps,
        vocab: c.vocab_size,
        tied: c.tie_word_embeddings,
        quantization,
        context_length: c.max_position_embeddings,
    };
    Ok((config, rope))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "model_type": "qwen3_next", "hidden_size": 32, "num_hidden_layers": 4,
            "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
            "num_experts": 0, "num_experts_per_tok": 0, "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 0, "mlp_only_layers": [],
            "moe_intermediate_size": 0, "rms_norm_eps": 1e-6, "vocab_size": 64,
            "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
            "max_position_embeddings": 512, "full_attention_interval": 2,
        })
    }

    fn parsed(v: Value) -> Result<(Config, Rope), ModelError> {
        let file: ConfigFile = serde_json::from_value(v).map_err(|e| ModelError::Config {
            path: "config.json".into(),
            message: e.to_string(),
        })?;
        parse(file, Path::new("config.json"))
    }

    fn error_of(key: &str, value: Value) -> String {
        let mut v = base();
        v[key] = value;
        match parsed(v) {
            Ok(_) => panic!("{key} accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_interval_th_layer_is_full_attention() {
        let (c, _) = parsed(base()).expect("valid");
        assert_eq!(
            c.mixers,
            [Mixer::Linear, Mixer::Full, Mixer::Linear, Mixer::Full]
        );
        assert_eq!(c.linear.conv_channels(), 2 * 16 + 32);
    }

    #[test]
    fn inconsistent_configs_name_their_key() {
        for (key, value) in [
            ("full_attention_interval", json!(0)),
            ("linear_num_value_heads", json!(3)),
            ("linear_conv_kernel_dim", json!(1)),
            ("num_key_value_heads", json!(3)),
            ("partial_rotary_factor", json!(0.0)),
            ("num_experts", json!(4)),
            ("mlp_only_layers", json!([7])),
        ] {
            let e = error_of(key, value);
            assert!(e.contains(key), "{key}: {e}");
        }
        let mut v = base();
        v.as_object_mut()
            .map(|m| m.remove("linear_conv_kernel_dim"));
        let e = parsed(v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("linear_conv_kernel_dim"), "{e}");
    }
}
