//! The `config.json` of a `Gemma4DSparkModel` checkpoint, read key by key
//! into a validated configuration: a missing key, a value of the wrong type
//! and a value we do not implement are each their own typed error naming the
//! key. Keys we do not read (Hugging Face bookkeeping) are ignored.

use std::path::{Path, PathBuf};

use serde_json::Value;
use spec_runtime::config::Quantization;
use spec_runtime::drafter_error::{config_object, read_config};

use crate::DSparkError;

/// The architecture name DSpark checkpoints carry.
pub const ARCHITECTURE: &str = "Gemma4DSparkModel";

/// The only activation implemented (GELU, tanh approximation).
pub const ACTIVATION: &str = "gelu_pytorch_tanh";

/// The only Markov head type implemented.
pub const MARKOV_HEAD_TYPE: &str = "vanilla";

/// RoPE of the drafter's (full-attention) layers.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// `rope_theta`.
    pub theta: f32,
    /// Fraction of each head's dimensions that rotate (`proportional` RoPE).
    pub partial_rotary_factor: f64,
    /// Position scale factor of `proportional` RoPE (`factor`, default 1).
    pub factor: f32,
}

/// A validated DSpark configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DSparkConfig {
    /// Hidden width (equal to the target's).
    pub hidden: i32,
    /// Draft decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: i32,
    /// Key (= value) heads.
    pub kv_heads: i32,
    /// Per-head width (`global_head_dim`).
    pub head_dim: i32,
    /// MLP width.
    pub intermediate: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// `final_logit_softcapping`, when set.
    pub softcap: Option<f32>,
    /// Vocabulary size (equal to the target's).
    pub vocab: i32,
    /// Positions of one draft block: the anchor and `block_size - 1` masks.
    pub block_size: usize,
    /// The mask token filling the block after the anchor.
    pub mask_token_id: u32,
    /// Target layers whose outputs the drafter reads, in increasing order.
    pub target_layer_ids: Vec<usize>,
    /// Decoder layers of the target the drafter was trained for.
    pub num_target_layers: usize,
    /// Rank of the Markov head (0: no Markov head).
    pub markov_rank: i32,
    /// Whether the checkpoint has a confidence head.
    pub confidence_head: bool,
    /// Whether the confidence head also reads the Markov embedding of the
    /// previous token.
    pub confidence_with_markov: bool,
    /// RoPE parameters.
    pub rope: RopeConfig,
    /// mlx-lm's quantization block (empty for float checkpoints).
    pub quantization: Quantization,
}

type Keys<'a> = spec_runtime::config_keys::Keys<'a, DSparkError>;

impl DSparkConfig {
    /// Reads and validates `dir/config.json`.
    pub fn read(dir: &Path) -> Result<(Self, PathBuf), DSparkError> {
        let (value, path) = read_config(dir)?;
        Ok((Self::parse(&value, &path)?, path))
    }

    /// Validates a parsed config; `path` names it in errors.
    pub fn parse(value: &Value, path: &Path) -> Result<Self, DSparkError> {
        let map = config_object(value, path)?;
        let k = Keys::new(map, path);
        let architectures = k.get("architectures")?;
        if architectures
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            != Some(ARCHITECTURE)
        {
            return Err(DSparkError::NotDSpark {
                path: path.to_path_buf(),
                found: architectures.to_string(),
            });
        }
        let k_eq_v = k.get("attention_k_eq_v")?;
        if k_eq_v != &Value::Bool(true) {
            return Err(k.unsupported("attention_k_eq_v", k_eq_v, "true (keys double as values)"));
        }
        let act = k.get("hidden_activation")?;
        if act.as_str() != Some(ACTIVATION) {
            return Err(k.unsupported("hidden_activation", act, ACTIVATION));
        }
        for (key, off) in [
            ("attention_bias", Value::Bool(false)),
            ("enable_moe_block", Value::Bool(false)),
        ] {
            if let Some(v) = map.get(key).filter(|v| !v.is_null() && **v != off) {
                return Err(k.unsupported(key, v, "false"));
            }
        }
        if let Some(v) = map
            .get("hidden_size_per_layer_input")
            .filter(|v| !v.is_null() && v.as_i64() != Some(0))
        {
            return Err(k.unsupported("hidden_size_per_layer_input", v, "0 (no per-layer inputs)"));
        }

        let hidden = k.positive("hidden_size")?;
        let layers = k.positive("num_hidden_layers")? as usize;
        let heads = k.positive("num_attention_heads")?;
        let head_dim = k.positive("global_head_dim")?;
        let kv_heads = k.positive("num_global_key_value_heads")?;
        if heads % kv_heads != 0 {
            return Err(k.invalid(
                "num_global_key_value_heads",
                format!("{kv_heads} does not divide num_attention_heads {heads}"),
            ));
        }
        let intermediate = k.positive("intermediate_size")?;
        let eps = k.float("rms_norm_eps")?;
        if eps <= 0.0 {
            return Err(k.invalid("rms_norm_eps", format!("must be positive, got {eps}")));
        }
        let softcap = match map.get("final_logit_softcapping").filter(|v| !v.is_null()) {
            None => None,
            Some(_) => {
                let s = k.float("final_logit_softcapping")?;
                if s <= 0.0 {
                    return Err(k.invalid(
                        "final_logit_softcapping",
                        format!("must be positive when set, got {s}"),
                    ));
                }
                Some(s as f32)
            }
        };
        let vocab = k.positive("vocab_size")?;
        let block_size = k.positive("block_size")? as usize;
        let mask = k.non_negative("mask_token_id")?;
        if mask >= vocab {
            return Err(k.invalid(
                "mask_token_id",
                format!("{mask} is outside the vocabulary of {vocab}"),
            ));
        }
        let num_target_layers = k.positive("num_target_layers")? as usize;
        let target_layer_ids = k.layer_ids("target_layer_ids", num_target_layers)?;

        let markov_rank = k.non_negative("markov_rank")?;
        if markov_rank > 0 {
            let kind = k.get("markov_head_type")?;
            if kind.as_str() != Some(MARKOV_HEAD_TYPE) {
                return Err(k.unsupported("markov_head_type", kind, MARKOV_HEAD_TYPE));
            }
        }
        let confidence_head = k.boolean("enable_confidence_head")?;
        let confidence_with_markov = if confidence_head {
            k.boolean("confidence_head_with_markov")?
        } else {
            false
        };
        if confidence_with_markov && markov_rank == 0 {
            return Err(k.invalid(
                "confidence_head_with_markov",
                "true needs a Markov head (markov_rank > 0)",
            ));
        }
        let rope = parse_rope(&k, head_dim)?;
        let quantization = Quantization::of_config(value, path)?;
        Ok(Self {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            eps: eps as f32,
            softcap,
            vocab,
            block_size,
            mask_token_id: mask as u32,
            target_layer_ids,
            num_target_layers,
            markov_rank,
            confidence_head,
            confidence_with_markov,
            rope,
            quantization,
        })
    }

    /// Width of the concatenated target taps the drafter reads.
    pub fn context_width(&self) -> i32 {
        self.target_layer_ids.len() as i32 * self.hidden
    }
}

/// `rope_parameters.full_attention`: `proportional` (partial rotation) or
/// `default` RoPE.
fn parse_rope(k: &Keys<'_>, head_dim: i32) -> Result<RopeConfig, DSparkError> {
    const KEY: &str = "rope_parameters.full_attention";
    let params = k.get("rope_parameters")?;
    let full = params
        .get("full_attention")
        .filter(|v| v.is_object())
        .ok_or_else(|| k.missing(KEY))?;
    let kind = full
        .get("rope_type")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let theta = full
        .get("rope_theta")
        .and_then(Value::as_f64)
        .filter(|t| *t > 0.0)
        .ok_or_else(|| k.invalid(KEY, format!("rope_theta missing or not positive in {full}")))?;
    let factor = full.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
    let partial = match kind {
        "proportional" => full
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0),
        "default" => 1.0,
        _ => {
            return Err(k.unsupported(
                &format!("{KEY}.rope_type"),
                &Value::String(kind.to_owned()),
                "proportional, default",
            ))
        }
    };
    let rotated = (f64::from(head_dim) * partial) as i32;
    if !(partial > 0.0 && partial <= 1.0) || rotated % 2 != 0 {
        return Err(k.invalid(KEY, format!("partial_rotary_factor {partial} must rotate an even number of the {head_dim} head dimensions")));
    }
    Ok(RopeConfig {
        theta: theta as f32,
        partial_rotary_factor: partial,
        factor: factor as f32,
    })
}
