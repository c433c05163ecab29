//! `config.json` of `qwen3_next` as mlx-lm 0.32.2's `qwen3_next.ModelArgs`
//! reads it (the keys it requires are required here too), validated into
//! [`Config`]: the layer pattern (`full_attention_interval`), the Gated
//! DeltaNet head geometry (`linear_*`), the conv kernel, the full attention
//! heads and their partial rotary. `validate` holds the checks `qwen3_5`'s
//! config (`qwen3_5_config`) shares. A config transformers 5.x saved has no
//! flat `rope_theta` / `partial_rotary_factor` (they sit in
//! `rope_parameters`) and states the pattern as `layer_types`
//! (`layer_pattern`): both are read too.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config::{Quantization, QuantizationKeys};
use crate::rope::Rope;
use crate::sparse_moe::MoeKeys;
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
    num_experts_per_tok: i32,
    decoder_sparse_step: usize,
    shared_expert_intermediate_size: i32,
    mlp_only_layers: Vec<usize>,
    moe_intermediate_size: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    rms_norm_eps: f32,
    vocab_size: i32,
    num_key_value_heads: i32,
    rope_theta: Option<f32>,
    partial_rotary_factor: Option<f32>,
    #[serde(default)]
    rope_parameters: Option<Value>,
    max_position_embeddings: usize,
    head_dim: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    rope_scaling: Option<Value>,
    #[serde(default)]
    full_attention_interval: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    // mlx-lm writes the block under both names; `quantization` wins.
    #[serde(flatten)]
    quantization: QuantizationKeys,
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

/// A mixture-of-experts block's sizes (`Qwen3NextSparseMoeBlock`: with a
/// shared expert).
pub use crate::sparse_moe::MoeConfig;

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

    /// Bytes of one layer's states after one position, for one row: the
    /// conv state (`kernel - 1` inputs of `activation_bytes` each channel)
    /// and the float32 recurrent state. A cache keeps this much per
    /// position it can roll back.
    pub fn state_bytes(&self, activation_bytes: usize) -> usize {
        let conv = (self.kernel - 1) as usize * self.conv_channels() as usize;
        let recurrent = (self.value_heads * self.value_dim * self.key_dim) as usize;
        conv * activation_bytes + recurrent * 4
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
    /// Dense MLP width.
    pub intermediate: i32,
    /// The expert blocks' sizes, when any layer has one.
    pub moe: Option<MoeConfig>,
    /// Per layer: an expert block (else the dense MLP).
    pub sparse: Vec<bool>,
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
    /// Per layer: a mixture-of-experts block (else the dense MLP).
    pub sparse: Vec<bool>,
    pub num_experts: usize,
    pub num_experts_per_tok: i32,
    pub moe_intermediate_size: i32,
    pub shared_expert_intermediate_size: i32,
    pub norm_topk_prob: bool,
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

/// The file's expert keys (its shared expert always present).
fn moe_keys(c: &ConfigFile) -> MoeKeys<'_> {
    MoeKeys {
        num_experts: c.num_experts,
        num_experts_per_tok: c.num_experts_per_tok,
        decoder_sparse_step: c.decoder_sparse_step,
        mlp_only_layers: &c.mlp_only_layers,
        moe_intermediate_size: c.moe_intermediate_size,
        shared_expert_intermediate_size: Some(c.shared_expert_intermediate_size),
        norm_topk_prob: c.norm_topk_prob,
    }
}

/// Parses and checks a `qwen3_next` config; `path` names it in errors.
pub(super) fn parse(c: ConfigFile, path: &Path) -> Result<(Config, Rope), ModelError> {
    let sparse = moe_keys(&c)
        .sparse_layers(c.num_hidden_layers)
        .map_err(|message| ModelError::Config {
            path: path.to_path_buf(),
            message,
        })?;
    let quantization = c.quantization.parse(path)?;
    let full_attention_interval = super::layer_pattern::interval(
        c.layer_types.as_deref(),
        c.full_attention_interval,
        c.num_hidden_layers,
        path,
    )?;
    // mlx-lm reads the flat keys; transformers 5.x writes them only inside
    // `rope_parameters`, which then also gives the RoPE type.
    let from_parameters = |key: &str| {
        c.rope_parameters
            .as_ref()
            .and_then(|p| p.get(key))
            .and_then(Value::as_f64)
            .map(|v| v as f32)
    };
    let missing = |key: &str| ModelError::Config {
        path: path.to_path_buf(),
        message: format!("{key} is missing (neither a top-level key nor in rope_parameters)"),
    };
    let rope_theta = c
        .rope_theta
        .or_else(|| from_parameters("rope_theta"))
        .ok_or_else(|| missing("rope_theta"))?;
    let partial_rotary_factor = c
        .partial_rotary_factor
        .or_else(|| from_parameters("partial_rotary_factor"))
        .ok_or_else(|| missing("partial_rotary_factor"))?;
    let rope_scaling = match (c.rope_scaling, c.rope_theta) {
        (Some(s), _) => Some(s),
        (None, None) => c.rope_parameters,
        (None, Some(_)) => None,
    };
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
        sparse,
        num_experts: c.num_experts,
        num_experts_per_tok: c.num_experts_per_tok,
        moe_intermediate_size: c.moe_intermediate_size,
        shared_expert_intermediate_size: c.shared_expert_intermediate_size,
        norm_topk_prob: c.norm_topk_prob,
        rms_norm_eps: c.rms_norm_eps,
        vocab_size: c.vocab_size,
        rope_theta,
        partial_rotary_factor,
        rope_scaling,
        max_position_embeddings: c.max_position_embeddings,
        tie_word_embeddings: c.tie_word_embeddings,
        attention_bias: c.attention_bias,
        full_attention_interval,
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
    let moe = MoeKeys {
        num_experts: c.num_experts,
        num_experts_per_tok: c.num_experts_per_tok,
        decoder_sparse_step: 1,
        mlp_only_layers: &[],
        moe_intermediate_size: c.moe_intermediate_size,
        shared_expert_intermediate_size: Some(c.shared_expert_intermediate_size),
        norm_topk_prob: c.norm_topk_prob,
    }
    .config(&c.sparse)
    .map_err(bad)?;
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
        moe,
        sparse: c.sparse,
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
    fn expert_blocks_follow_the_sparse_step_and_bad_sizes_are_named() {
        let mut v = base();
        for (k, x) in [
            ("num_experts", json!(4)),
            ("num_experts_per_tok", json!(2)),
            ("moe_intermediate_size", json!(16)),
            ("shared_expert_intermediate_size", json!(24)),
            ("decoder_sparse_step", json!(2)),
            ("mlp_only_layers", json!([3])),
        ] {
            v[k] = x;
        }
        let (c, _) = parsed(v.clone()).expect("parse");
        assert_eq!(c.sparse, [false, true, false, false]);
        let moe = c.moe.expect("experts");
        assert_eq!((moe.experts, moe.top_k, moe.intermediate), (4, 2, 16));
        assert_eq!(
            (moe.shared_intermediate, moe.norm_topk_prob),
            (Some(24), false)
        );
        for (key, value) in [
            ("num_experts_per_tok", json!(5)),
            ("moe_intermediate_size", json!(0)),
            ("decoder_sparse_step", json!(0)),
        ] {
            let mut bad = v.clone();
            bad[key] = value;
            let e = parsed(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn inconsistent_configs_name_their_key() {
        for (key, value) in [
            ("full_attention_interval", json!(0)),
            ("linear_num_value_heads", json!(3)),
            ("linear_conv_kernel_dim", json!(1)),
            ("num_key_value_heads", json!(3)),
            ("partial_rotary_factor", json!(0.0)),
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
        let mut v = base();
        v.as_object_mut().map(|m| m.remove("rope_theta"));
        let e = parsed(v).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("rope_theta"), "{e}");
    }

    /// What transformers 5.24's `save_pretrained` writes: the RoPE in
    /// `rope_parameters`, the pattern as `layer_types` only.
    #[test]
    fn a_config_saved_by_transformers_reads_as_its_flat_twin() {
        let mut saved = base();
        let m = saved.as_object_mut().expect("object");
        for key in [
            "rope_theta",
            "partial_rotary_factor",
            "full_attention_interval",
        ] {
            m.remove(key);
        }
        saved["rope_parameters"] = json!({
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        });
        saved["layer_types"] = json!([
            "linear_attention",
            "full_attention",
            "linear_attention",
            "full_attention",
        ]);
        let (c, rope) = parsed(saved.clone()).expect("saved by transformers");
        let (flat, flat_rope) = parsed(base()).expect("flat");
        assert_eq!(c.mixers, flat.mixers);
        assert_eq!(format!("{rope:?}"), format!("{flat_rope:?}"));
        saved["layer_types"][3] = json!("linear_attention");
        let e = parsed(saved)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("layer_types[3]"), "{e}");
    }
}
