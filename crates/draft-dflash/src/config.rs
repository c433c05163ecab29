//! The `config.json` of a DFlash drafter (z-lab's `DFlashDraftModel`, facts
//! from `dflash` 0.1.0's `model_mlx.py` loader), read key by key into a
//! validated configuration. Top-level keys we do not read are Hugging Face
//! bookkeeping and ignored; every key of `dflash_config` is known. DFlash2
//! (`DFlash2DraftModel`) adds its convolution and selector keys, each error
//! naming the key; `layer_types` may mark layers `sliding_attention` (with a
//! `sliding_window`).

use std::path::{Path, PathBuf};

use serde_json::Value;
use spec_runtime::config::Quantization;
use spec_runtime::config_keys;
use spec_runtime::drafter_error::{config_object, read_config};

use crate::DFlashError;

type Keys<'a> = config_keys::Keys<'a, DFlashError>;

/// The architecture name DFlash checkpoints carry.
pub const ARCHITECTURE: &str = "DFlashDraftModel";

/// The architecture name DFlash2 checkpoints carry.
pub const ARCHITECTURE_2: &str = "DFlash2DraftModel";

/// Every architecture name this crate loads.
pub const ARCHITECTURES: [&str; 2] = [ARCHITECTURE, ARCHITECTURE_2];

/// The block width `model_mlx.py` assumes when the config gives none.
const DEFAULT_BLOCK_SIZE: i32 = 16;

/// Keys of `dflash_config` that only DFlash2 reads; on a `DFlashDraftModel`
/// any non-zero one is refused.
const DFLASH2_KEYS: [&str; 4] = [
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
];

/// Every key of `dflash_config` this reader knows.
const DFLASH_KEYS: [&str; 10] = [
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "final_logit_softcapping",
    "input_embedding_scale",
    "output_multiplier",
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
];

/// A validated DFlash configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DFlashConfig {
    /// Hidden width (equal to the target's).
    pub hidden: i32,
    /// Draft decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: i32,
    /// Key and value heads.
    pub kv_heads: i32,
    /// Per-head width.
    pub head_dim: i32,
    /// MLP width.
    pub intermediate: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Vocabulary size (equal to the target's, whose embeddings and head
    /// the drafter uses).
    pub vocab: i32,
    /// Positions of one draft block: the anchor and `block_size - 1` masks,
    /// each mask proposing one token.
    pub block_size: usize,
    /// The mask token filling the block after the anchor.
    pub mask_token_id: u32,
    /// Target layers whose outputs the drafter reads, in increasing order.
    pub target_layer_ids: Vec<usize>,
    /// Decoder layers of the target the drafter was trained for.
    pub num_target_layers: usize,
    /// `final_logit_softcapping`, when set and positive.
    pub softcap: Option<f32>,
    /// Factor on the target's embeddings (`input_embedding_scale`).
    pub input_embedding_scale: f32,
    /// Factor on the logits before the softcap (`output_multiplier`).
    pub output_multiplier: f32,
    /// `rope_theta`.
    pub rope_theta: f32,
    /// `rope_parameters` / `rope_scaling`, as the config gives it.
    pub rope_scaling: Option<Value>,
    /// Per layer, whether it is a `sliding_attention` layer.
    pub sliding: Vec<bool>,
    /// `sliding_window` (at least 2) when some layer slides.
    pub sliding_window: Option<usize>,
    /// `is_causal` as the config gives it: whether every layer masks the
    /// block causally; absent, sliding layers do and full layers do not (as
    /// `model_mlx.py` reads it). See [`DFlashConfig::causal`].
    pub is_causal: Option<bool>,
    /// DFlash2's convolution and candidate selector (`DFlash2DraftModel`).
    pub dflash2: Option<DFlash2Config>,
    /// mlx-lm's quantization block (empty for float checkpoints).
    pub quantization: Quantization,
    /// The config file, for errors raised after parsing.
    pub path: PathBuf,
}

impl DFlashConfig {
    /// Reads and validates `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, DFlashError> {
        let (value, path) = read_config(dir)?;
        Self::parse(&value, &path)
    }

    /// Validates a parsed config; `path` names it in errors.
    pub fn parse(value: &Value, path: &Path) -> Result<Self, DFlashError> {
        let map = config_object(value, path)?;
        let k = Keys::new(map, path);
        let architectures = k.get("architectures")?;
        let dflash2 = match architectures
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
        {
            Some(ARCHITECTURE) => false,
            Some(ARCHITECTURE_2) => true,
            _ => {
                return Err(k.unsupported(
                    "architectures",
                    architectures,
                    "[\"DFlashDraftModel\"], [\"DFlash2DraftModel\"]",
                ))
            }
        };
        let d = k
            .nested("dflash_config")?
            .ok_or_else(|| k.missing("dflash_config"))?;
        if let Some(unknown) = d
            .map()
            .keys()
            .find(|key| !DFLASH_KEYS.contains(&key.as_str()))
        {
            return Err(d.unsupported(unknown, &d.map()[unknown], &DFLASH_KEYS.join(", ")));
        }
        if !dflash2 {
            for key in DFLASH2_KEYS {
                if let Some(v) = d.opt(key).filter(|v| v.as_i64() != Some(0)) {
                    return Err(d.unsupported(key, v, "0 (only DFlash2DraftModel reads it)"));
                }
            }
        }
        let is_causal = match k.opt("is_causal") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => return Err(k.unsupported("is_causal", v, "true, false or null")),
        };
        if let Some(v) = k
            .opt("attention_bias")
            .filter(|v| **v != Value::Bool(false))
        {
            return Err(k.unsupported("attention_bias", v, "false"));
        }
        if let Some(v) = k.opt("hidden_act").filter(|v| v.as_str() != Some("silu")) {
            return Err(k.unsupported("hidden_act", v, "silu"));
        }

        let hidden = k.positive("hidden_size")?;
        let layers = k.positive("num_hidden_layers")? as usize;
        let (sliding, sliding_window) = layer_types(&k, layers)?;
        let heads = k.positive("num_attention_heads")?;
        let kv_heads = k.positive("num_key_value_heads")?;
        if heads % kv_heads != 0 {
            return Err(k.invalid(
                "num_key_value_heads",
                format!("{kv_heads} does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = k.positive("head_dim")?;
        let intermediate = k.positive("intermediate_size")?;
        let eps = k.float("rms_norm_eps")?;
        if eps <= 0.0 {
            return Err(k.invalid("rms_norm_eps", format!("must be positive, got {eps}")));
        }
        let vocab = k.positive("vocab_size")?;

        let block_size = match (d.opt("block_size"), k.opt("block_size")) {
            (Some(_), _) => d.positive("block_size")?,
            (None, Some(_)) => k.positive("block_size")?,
            (None, None) => DEFAULT_BLOCK_SIZE,
        };
        if block_size < 2 {
            let key = if d.opt("block_size").is_some() {
                &d
            } else {
                &k
            };
            return Err(key.invalid(
                "block_size",
                "a block needs the anchor and at least one mask",
            ));
        }
        let mask = d.non_negative("mask_token_id")?;
        if mask >= vocab {
            return Err(d.invalid(
                "mask_token_id",
                format!("{mask} is outside the vocabulary of {vocab}"),
            ));
        }
        let dflash2 = if dflash2 {
            Some(DFlash2Config::parse(&d, hidden, vocab)?)
        } else {
            None
        };
        let num_target_layers = k.positive("num_target_layers")? as usize;
        let target_layer_ids = d.layer_ids("target_layer_ids", num_target_layers)?;
        let softcap = match (
            d.opt("final_logit_softcapping"),
            k.opt("final_logit_softcapping"),
        ) {
            (Some(_), _) => d.float("final_logit_softcapping")?,
            (None, Some(_)) => k.float("final_logit_softcapping")?,
            (None, None) => 0.0,
        };
        let factor = |key: &str| -> Result<f32, DFlashError> {
            match d.opt(key) {
                None => Ok(1.0),
                Some(_) => Ok(d.float(key)? as f32),
            }
        };
        let rope_scaling = k
            .opt("rope_parameters")
            .or_else(|| k.opt("rope_scaling"))
            .cloned();
        let rope_theta = match k.opt("rope_theta") {
            Some(_) => k.float("rope_theta")?,
            None => rope_scaling
                .as_ref()
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
        };
        if rope_theta <= 0.0 {
            return Err(k.invalid("rope_theta", format!("must be positive, got {rope_theta}")));
        }
        let quantization = Quantization::of_config(value, path)?;
        Ok(Self {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            eps: eps as f32,
            vocab,
            block_size: block_size as usize,
            mask_token_id: mask as u32,
            target_layer_ids,
            num_target_layers,
            softcap: (softcap > 0.0).then_some(softcap as f32),
            input_embedding_scale: factor("input_embedding_scale")?,
            output_multiplier: factor("output_multiplier")?,
            rope_theta: rope_theta as f32,
            rope_scaling,
            sliding,
            sliding_window,
            is_causal,
            dflash2,
            quantization,
            path: path.to_path_buf(),
        })
    }

    /// Width of the concatenated target taps the drafter reads.
    pub fn context_width(&self) -> i32 {
        self.target_layer_ids.len() as i32 * self.hidden
    }

    /// Whether `layer` masks the block causally: `is_causal` where the
    /// config sets it, else whether the layer slides.
    pub fn causal(&self, layer: usize) -> bool {
        self.is_causal
            .unwrap_or_else(|| self.sliding.get(layer).copied().unwrap_or(false))
    }
}

/// DFlash2's `dflash_config` keys, validated against the layer width and
/// the vocabulary: the grouped dynamic causal convolution's kernel and
/// group (which must divide `hidden_size`) and the candidate selector's
/// codebook rank and candidate count (at most the vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DFlash2Config {
    /// Taps of each causal convolution (`conv_kernel_size`).
    pub conv_kernel_size: i32,
    /// Channels sharing one dynamic kernel (`conv_group_size`).
    pub conv_group_size: i32,
    /// Width of the selector's codebooks (`selector_rank`).
    pub selector_rank: i32,
    /// Candidates the selector scores per position (`selector_top_k`).
    pub selector_top_k: i32,
}

impl DFlash2Config {
    /// Reads the four keys of `d` (`dflash_config`); every one is required
    /// and positive, each error names its key.
    fn parse(d: &Keys<'_>, hidden: i32, vocab: i32) -> Result<Self, DFlashError> {
        let conv_kernel_size = d.positive("conv_kernel_size")?;
        let conv_group_size = d.positive("conv_group_size")?;
        if hidden % conv_group_size != 0 {
            return Err(d.invalid(
                "conv_group_size",
                format!("{conv_group_size} does not divide hidden_size {hidden}"),
            ));
        }
        let selector_rank = d.positive("selector_rank")?;
        let selector_top_k = d.positive("selector_top_k")?;
        if selector_top_k > vocab {
            return Err(d.invalid(
                "selector_top_k",
                format!("{selector_top_k} candidates exceed the vocabulary of {vocab}"),
            ));
        }
        Ok(Self {
            conv_kernel_size,
            conv_group_size,
            selector_rank,
            selector_top_k,
        })
    }
}

/// `layer_types`, when given: one entry per layer, each `full_attention` or
/// `sliding_attention`; with a sliding layer, `sliding_window` (at least 2:
/// `model_mlx.py` keeps `sliding_window - 1` context rows). Returns per layer
/// whether it slides, and the window.
fn layer_types(k: &Keys<'_>, layers: usize) -> Result<(Vec<bool>, Option<usize>), DFlashError> {
    const KEY: &str = "layer_types";
    const NAMES: [&str; 2] = ["full_attention", "sliding_attention"];
    let Some(v) = k.opt(KEY).filter(|v| !v.is_null()) else {
        return Ok((vec![false; layers], None));
    };
    let types = v
        .as_array()
        .ok_or_else(|| k.invalid(KEY, format!("expected a list, got {v}")))?;
    if types.len() != layers {
        return Err(k.invalid(KEY, format!("{} entries for {layers} layers", types.len())));
    }
    if let Some(t) = types
        .iter()
        .find(|t| !t.as_str().is_some_and(|n| NAMES.contains(&n)))
    {
        return Err(k.unsupported(KEY, t, &NAMES.join(", ")));
    }
    let sliding: Vec<bool> = types.iter().map(|t| t.as_str() == Some(NAMES[1])).collect();
    if !sliding.contains(&true) {
        return Ok((sliding, None));
    }
    let window = k.positive("sliding_window")?;
    if window < 2 {
        return Err(k.invalid(
            "sliding_window",
            format!("{window} keeps no context row (at least 2)"),
        ));
    }
    Ok((sliding, Some(window as usize)))
}
