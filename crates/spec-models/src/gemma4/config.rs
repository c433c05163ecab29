//! `config.json` of `gemma4_text` (and of the `gemma4` wrapper's
//! `text_config`), with mlx-lm 0.32.2's defaults for absent keys and
//! transformers' `per_layer_config` overrides (what its `save_pretrained`
//! writes), validated into [`Config`].

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config::Quantization;
use crate::ModelError;

/// The keys `gemma4_text.ModelArgs` reads; defaults are mlx-lm's.
#[derive(Debug, Deserialize)]
pub(crate) struct TextConfigFile {
    #[serde(default = "d::hidden_size")]
    hidden_size: i32,
    #[serde(default = "d::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "d::intermediate_size")]
    intermediate_size: i32,
    #[serde(default = "d::num_attention_heads")]
    num_attention_heads: i32,
    #[serde(default = "d::head_dim")]
    head_dim: i32,
    #[serde(default = "d::global_head_dim")]
    global_head_dim: Option<i32>,
    #[serde(default = "d::rms_norm_eps")]
    rms_norm_eps: f32,
    #[serde(default = "d::vocab_size")]
    vocab_size: i32,
    #[serde(default = "d::vocab_size")]
    vocab_size_per_layer_input: i32,
    #[serde(default = "d::num_key_value_heads")]
    num_key_value_heads: i32,
    #[serde(default)]
    num_global_key_value_heads: Option<i32>,
    #[serde(default = "d::num_kv_shared_layers")]
    num_kv_shared_layers: usize,
    #[serde(default = "d::hidden_size_per_layer_input")]
    hidden_size_per_layer_input: Option<i32>,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    rope_parameters: Option<Value>,
    #[serde(default = "d::sliding_window")]
    sliding_window: usize,
    #[serde(default = "d::sliding_window_pattern")]
    sliding_window_pattern: usize,
    #[serde(default = "d::max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default = "d::final_logit_softcapping")]
    final_logit_softcapping: Option<f32>,
    #[serde(default = "d::yes")]
    use_double_wide_mlp: bool,
    #[serde(default)]
    enable_moe_block: bool,
    #[serde(default)]
    num_experts: Option<i32>,
    #[serde(default)]
    top_k_experts: Option<i32>,
    #[serde(default)]
    moe_intermediate_size: Option<i32>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    /// transformers' sparse per-layer overrides (`{"3": {"head_dim": 512}}`),
    /// which its `save_pretrained` writes instead of `global_head_dim` and
    /// `num_global_key_value_heads`.
    #[serde(default)]
    per_layer_config: Option<serde_json::Map<String, Value>>,
    #[serde(default = "d::yes")]
    tie_word_embeddings: bool,
    #[serde(default)]
    hidden_activation: Option<String>,
}

/// The `gemma4` wrapper: a text model under `text_config`.
#[derive(Debug, Deserialize)]
pub(crate) struct WrapperConfigFile {
    #[serde(default)]
    text_config: Option<serde_json::Map<String, Value>>,
    /// mlx-lm's wrapper sets the text model's vocabulary from here (default
    /// 262144); transformers 5.24 writes it only inside `text_config`.
    #[serde(default)]
    vocab_size: Option<i32>,
}

/// mlx-lm's `ModelArgs` defaults.
mod d {
    pub fn hidden_size() -> i32 {
        1536
    }
    pub fn num_hidden_layers() -> usize {
        35
    }
    pub fn intermediate_size() -> i32 {
        6144
    }
    pub fn num_attention_heads() -> i32 {
        8
    }
    pub fn head_dim() -> i32 {
        256
    }
    pub fn global_head_dim() -> Option<i32> {
        Some(512)
    }
    pub fn rms_norm_eps() -> f32 {
        1e-6
    }
    pub fn vocab_size() -> i32 {
        262_144
    }
    pub fn num_key_value_heads() -> i32 {
        1
    }
    pub fn num_kv_shared_layers() -> usize {
        20
    }
    pub fn hidden_size_per_layer_input() -> Option<i32> {
        Some(256)
    }
    pub fn sliding_window() -> usize {
        512
    }
    pub fn sliding_window_pattern() -> usize {
        5
    }
    pub fn max_position_embeddings() -> usize {
        131_072
    }
    pub fn final_logit_softcapping() -> Option<f32> {
        Some(30.0)
    }
    pub fn yes() -> bool {
        true
    }
}

/// Kind of an attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Local attention over the last `sliding_window` positions.
    Sliding,
    /// Global attention over every position.
    Full,
}

/// How one kind of layer rotates its queries and keys.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeSpec {
    /// `nn.RoPE` over all `dims` (`default`, or `linear` with a position scale).
    Base {
        /// Frequency base.
        theta: f32,
        /// Position scale (1 for `default`).
        scale: f32,
    },
    /// mlx-lm's `ProportionalRoPE`: the first `rotated` of `dims` rotated with
    /// frequencies `factor * theta^(i / dims)`, the rest left alone.
    Proportional {
        /// Frequency base.
        theta: f32,
        /// Rotated dimensions (`int(dims * partial_rotary_factor)`).
        rotated: i32,
        /// Frequency factor.
        factor: f32,
    },
}

/// Sizes of the mixture-of-experts block (`enable_moe_block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub experts: i32,
    /// Experts each token uses.
    pub top_k: i32,
    /// Each expert's MLP width.
    pub intermediate: i32,
}

/// Per-layer facts derived from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Sliding or full attention.
    pub kind: LayerKind,
    /// Per-head width (`global_head_dim` on full layers when set).
    pub head_dim: i32,
    /// Key/value heads.
    pub kv_heads: i32,
    /// Keys double as values (no `v_proj`).
    pub k_eq_v: bool,
    /// The layer whose keys and values this one reads: itself, or for a
    /// KV-shared layer the last non-shared layer of the same kind.
    pub kv_source: usize,
    /// MLP width.
    pub intermediate: i32,
}

/// The validated `gemma4_text` configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `gemma4_text`, or `gemma4` for the wrapper.
    pub model_type: String,
    /// Hidden width.
    pub hidden: i32,
    /// Query heads.
    pub heads: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Vocabulary size.
    pub vocab: i32,
    /// Rows of the per-layer input table.
    pub vocab_per_layer: i32,
    /// Width of each layer's per-layer input, when the model has them.
    pub per_layer_input: Option<i32>,
    /// Sliding window of the sliding layers.
    pub sliding_window: usize,
    /// RoPE of sliding layers.
    pub rope_sliding: RopeSpec,
    /// RoPE of full layers.
    pub rope_full: RopeSpec,
    /// GPT-J style RoPE pairs.
    pub rope_traditional: bool,
    /// `tanh(x / c) * c` on the logits, when set.
    pub softcap: Option<f32>,
    /// Output head shares the embedding table.
    pub tied: bool,
    /// One entry per decoder layer.
    pub layers: Vec<LayerSpec>,
    /// Layers that own a cache (`num_hidden_layers - num_kv_shared_layers`).
    pub cached_layers: usize,
    /// The mixture-of-experts block every layer has, when enabled.
    pub moe: Option<MoeConfig>,
    /// Quantization block.
    pub quantization: Quantization,
    /// `max_position_embeddings`.
    pub context_length: usize,
}

impl Config {
    /// Validates a text config; `path` names the file in errors.
    pub(crate) fn parse(
        c: TextConfigFile,
        model_type: &str,
        quantization: Quantization,
        path: &Path,
    ) -> Result<Self, ModelError> {
        let bad = |message: String| ModelError::Config {
            path: path.to_path_buf(),
            message,
        };
        let moe = if c.enable_moe_block {
            let need = |name: &str, v: Option<i32>| {
                v.filter(|v| *v > 0)
                    .ok_or_else(|| bad(format!("enable_moe_block needs a positive {name}")))
            };
            let m = MoeConfig {
                experts: need("num_experts", c.num_experts)?,
                top_k: need("top_k_experts", c.top_k_experts)?,
                intermediate: need("moe_intermediate_size", c.moe_intermediate_size)?,
            };
            if m.top_k > m.experts {
                return Err(bad(format!(
                    "top_k_experts {} exceeds num_experts {}",
                    m.top_k, m.experts
                )));
            }
            Some(m)
        } else {
            None
        };
        if let Some(act) = c
            .hidden_activation
            .as_deref()
            .filter(|a| *a != "gelu_pytorch_tanh")
        {
            return Err(bad(format!(
                "hidden_activation `{act}` is not supported (gelu_pytorch_tanh is)"
            )));
        }
        for (name, v) in [
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_attention_heads", c.num_attention_heads),
            ("head_dim", c.head_dim),
            ("vocab_size", c.vocab_size),
            ("num_key_value_heads", c.num_key_value_heads),
        ] {
            if v <= 0 {
                return Err(bad(format!("{name} must be positive, got {v}")));
            }
        }
        let n = c.num_hidden_layers;
        if n == 0 {
            return Err(bad("num_hidden_layers must be positive".into()));
        }
        if c.sliding_window == 0 {
            return Err(bad("sliding_window must be positive".into()));
        }
        if c.num_kv_shared_layers >= n {
            return Err(bad(format!(
                "num_kv_shared_layers {} leaves no layer with its own cache ({n} layers)",
                c.num_kv_shared_layers
            )));
        }
        let types = match c.layer_types {
            Some(t) if t.len() != n => {
                return Err(bad(format!(
                    "layer_types has {} entries for {n} layers",
                    t.len()
                )))
            }
            Some(t) => t,
            None => {
                if c.sliding_window_pattern == 0 {
                    return Err(bad("sliding_window_pattern must be positive".into()));
                }
                (0..n)
                    .map(|i| {
                        if i % c.sliding_window_pattern == c.sliding_window_pattern - 1 {
                            "full_attention"
                        } else {
                            "sliding_attention"
                        }
                        .to_owned()
                    })
                    .collect()
            }
        };
        let kinds = types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(LayerKind::Sliding),
                "full_attention" => Ok(LayerKind::Full),
                other => Err(bad(format!("layer type `{other}` is not supported"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let global_head_dim = c.global_head_dim.filter(|d| *d != 0);
        if let Some(d) = global_head_dim.filter(|d| *d < 0) {
            return Err(bad(format!("global_head_dim must be positive, got {d}")));
        }
        let overrides = c
            .per_layer_config
            .as_ref()
            .map(|p| layer_overrides(p, n, &bad))
            .transpose()?;
        // Head width and key/value heads of layer `i`: transformers'
        // per-layer overrides when the config has them (then the global
        // values are the rest's), else mlx-lm's `global_head_dim` and
        // `num_global_key_value_heads` rules for full layers.
        let dims = |i: usize, kind: LayerKind| -> (i32, i32) {
            if let Some(o) = &overrides {
                return (
                    o[i].head_dim.unwrap_or(c.head_dim),
                    o[i].kv_heads.unwrap_or(c.num_key_value_heads),
                );
            }
            let head_dim = match (kind, global_head_dim) {
                (LayerKind::Full, Some(d)) => d,
                _ => c.head_dim,
            };
            let kv_heads = match (
                c.attention_k_eq_v && kind == LayerKind::Full,
                c.num_global_key_value_heads,
            ) {
                (true, Some(h)) => h,
                _ => c.num_key_value_heads,
            };
            (head_dim, kv_heads)
        };
        let kind_dims = |want: LayerKind| -> Result<i32, ModelError> {
            let mut widths = kinds
                .iter()
                .enumerate()
                .filter(|(_, k)| **k == want)
                .map(|(i, &k)| dims(i, k).0);
            let first = widths.next().unwrap_or(c.head_dim);
            match widths.find(|w| *w != first) {
                Some(other) => Err(bad(format!(
                    "{want:?} layers have head widths {first} and {other}: one RoPE per layer kind needs one width"
                ))),
                None => Ok(first),
            }
        };
        let (rope_sliding, rope_full) = ropes(
            c.rope_parameters.as_ref(),
            kind_dims(LayerKind::Sliding)?,
            kind_dims(LayerKind::Full)?,
            &bad,
        )?;
        let cached = n - c.num_kv_shared_layers;
        let mut layers = Vec::with_capacity(n);
        for (i, &kind) in kinds.iter().enumerate() {
            let (head_dim, kv_heads) = dims(i, kind);
            let k_eq_v = c.attention_k_eq_v && kind == LayerKind::Full;
            if kv_heads <= 0 || c.num_attention_heads % kv_heads != 0 {
                return Err(bad(format!("layer {i}: num_attention_heads {} is not a multiple of {kv_heads} key/value heads", c.num_attention_heads)));
            }
            let kv_source = if i < cached {
                i
            } else {
                (0..cached).rev().find(|&j| kinds[j] == kind).ok_or_else(|| {
                    bad(format!("KV-shared layer {i} ({}) has no earlier non-shared layer of its kind to share", types[i]))
                })?
            };
            let shared = i >= cached && cached > 0;
            let double = c.use_double_wide_mlp && shared;
            layers.push(LayerSpec {
                kind,
                head_dim,
                kv_heads,
                k_eq_v,
                kv_source,
                intermediate: c.intermediate_size * if double { 2 } else { 1 },
            });
        }
        let per_layer_input = c.hidden_size_per_layer_input.filter(|d| *d != 0);
        if let Some(d) = per_layer_input.filter(|d| *d < 0) {
            return Err(bad(format!(
                "hidden_size_per_layer_input must be positive, got {d}"
            )));
        }
        if per_layer_input.is_some() && c.vocab_size_per_layer_input <= 0 {
            return Err(bad(format!(
                "vocab_size_per_layer_input must be positive, got {}",
                c.vocab_size_per_layer_input
            )));
        }
        Ok(Self {
            model_type: model_type.to_owned(),
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            eps: c.rms_norm_eps,
            vocab: c.vocab_size,
            vocab_per_layer: c.vocab_size_per_layer_input,
            per_layer_input,
            sliding_window: c.sliding_window,
            rope_sliding,
            rope_full,
            rope_traditional: c.rope_traditional,
            softcap: c.final_logit_softcapping,
            tied: c.tie_word_embeddings,
            layers,
            cached_layers: cached,
            moe,
            quantization,
            context_length: c.max_position_embeddings,
        })
    }
}

/// One layer's entry of `per_layer_config`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LayerOverride {
    head_dim: Option<i32>,
    kv_heads: Option<i32>,
}

/// `per_layer_config` as one entry per layer (empty where absent); layer
/// keys must be indices below `layers`, and only `head_dim` and
/// `num_key_value_heads` (the attributes Gemma-4 varies per layer) may be
/// overridden.
fn layer_overrides(
    map: &serde_json::Map<String, Value>,
    layers: usize,
    bad: &dyn Fn(String) -> ModelError,
) -> Result<Vec<LayerOverride>, ModelError> {
    let mut out = vec![LayerOverride::default(); layers];
    for (key, entry) in map {
        let i = key
            .parse::<usize>()
            .ok()
            .filter(|i| *i < layers)
            .ok_or_else(|| {
                bad(format!(
                    "per_layer_config: `{key}` is not a layer index below {layers}"
                ))
            })?;
        let fields = entry
            .as_object()
            .ok_or_else(|| bad(format!("per_layer_config.{key} is not an object")))?;
        for (name, v) in fields {
            let value = v
                .as_i64()
                .and_then(|v| i32::try_from(v).ok())
                .filter(|v| *v > 0)
                .ok_or_else(|| {
                    bad(format!(
                        "per_layer_config.{key}.{name} must be a positive integer, got {v}"
                    ))
                });
            match name.as_str() {
                "head_dim" => out[i].head_dim = Some(value?),
                "num_key_value_heads" => out[i].kv_heads = Some(value?),
                other => {
                    return Err(bad(format!(
                        "per_layer_config.{key}: overriding `{other}` is not supported (head_dim and num_key_value_heads are)"
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// The RoPEs of sliding and full layers (head widths `sliding_dims` and
/// `full_dims`), from `rope_parameters` (mlx-lm's default block when absent).
fn ropes(
    params: Option<&Value>,
    sliding_dims: i32,
    full_dims: i32,
    bad: &dyn Fn(String) -> ModelError,
) -> Result<(RopeSpec, RopeSpec), ModelError> {
    let default_block;
    let params = match params {
        Some(p) if !p.is_null() => p,
        _ => {
            default_block = serde_json::json!({
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
                "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10_000.0, "rope_type": "default"},
            });
            &default_block
        }
    };
    let one = |key: &str, dims: i32| -> Result<RopeSpec, ModelError> {
        let empty = Value::Object(serde_json::Map::new());
        let p = params.get(key).unwrap_or(&empty);
        let theta = p
            .get("rope_theta")
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0) as f32;
        let kind = p
            .get("type")
            .or_else(|| p.get("rope_type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let factor = p.get("factor").and_then(Value::as_f64);
        match kind {
            "default" => Ok(RopeSpec::Base { theta, scale: 1.0 }),
            "linear" => {
                let f = factor.ok_or_else(|| bad(format!("rope_parameters.{key}: linear RoPE needs a factor")))?;
                Ok(RopeSpec::Base { theta, scale: (1.0 / f) as f32 })
            }
            "proportional" => {
                let fraction = p.get("partial_rotary_factor").and_then(Value::as_f64).unwrap_or(1.0);
                let rotated = (f64::from(dims) * fraction) as i32;
                if !(0..=dims).contains(&rotated) || rotated % 2 != 0 {
                    return Err(bad(format!("rope_parameters.{key}: proportional RoPE rotates {rotated} of {dims} dimensions (must be even, 0..={dims})")));
                }
                Ok(RopeSpec::Proportional { theta, rotated, factor: factor.unwrap_or(1.0) as f32 })
            }
            other => Err(bad(format!("rope_parameters.{key}: rope_type `{other}` is not supported for gemma4 (default, linear, proportional are)"))),
        }
    };
    Ok((
        one("sliding_attention", sliding_dims)?,
        one("full_attention", full_dims)?,
    ))
}

/// Reads a config value as either model type: `gemma4_text` directly, or the
/// `gemma4` wrapper's `text_config` (whose vocabulary and head-count defaults
/// the wrapper sets, as mlx-lm's `gemma4.ModelArgs` does).
pub(crate) fn parse_value(value: Value, path: &Path) -> Result<Config, ModelError> {
    let bad = |message: String| ModelError::Config {
        path: path.to_path_buf(),
        message,
    };
    let model_type = value
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let quantization = Quantization::of_config(&value, path)?;
    let text = match model_type.as_str() {
        "gemma4_text" => value,
        "gemma4" => {
            let w: WrapperConfigFile =
                serde_json::from_value(value).map_err(|e| ModelError::config_parse(path, "", e))?;
            let mut t = w.text_config.unwrap_or_default();
            match w.vocab_size {
                Some(v) => {
                    t.insert("vocab_size".into(), Value::from(v));
                }
                None => {
                    t.entry("vocab_size")
                        .or_insert(Value::from(d::vocab_size()));
                }
            }
            t.entry("num_attention_heads").or_insert(Value::from(8));
            t.entry("num_key_value_heads").or_insert(Value::from(1));
            Value::Object(t)
        }
        other => return Err(bad(format!("model_type `{other}` is not a gemma4 model"))),
    };
    let file: TextConfigFile =
        serde_json::from_value(text).map_err(|e| ModelError::config_parse(path, "", e))?;
    Config::parse(file, &model_type, quantization, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(extra: Value) -> Value {
        let mut c = serde_json::json!({
            "model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 5, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
            "vocab_size": 320, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "sliding_window": 8,
        });
        if let (Some(map), Some(more)) = (c.as_object_mut(), extra.as_object()) {
            map.extend(more.clone());
        }
        c
    }

    fn parse(c: Value) -> Result<Config, ModelError> {
        parse_value(c, Path::new("config.json"))
    }

    #[test]
    fn layer_pattern_sharing_and_mlp_widths_follow_mlx_lm() {
        let c = parse(text(serde_json::json!({"sliding_window_pattern": 3, "num_kv_shared_layers": 2, "use_double_wide_mlp": true})))
            .expect("parse");
        let kinds: Vec<LayerKind> = c.layers.iter().map(|l| l.kind).collect();
        use LayerKind::{Full, Sliding};
        assert_eq!(kinds, [Sliding, Sliding, Full, Sliding, Sliding]);
        let sources: Vec<usize> = c.layers.iter().map(|l| l.kv_source).collect();
        assert_eq!(
            sources,
            [0, 1, 2, 1, 1],
            "shared layers borrow the last non-shared layer of their kind"
        );
        let widths: Vec<i32> = c.layers.iter().map(|l| l.intermediate).collect();
        assert_eq!(widths, [128, 128, 128, 256, 256]);
        assert_eq!((c.layers[2].head_dim, c.layers[0].head_dim), (32, 16));
        assert_eq!(
            c.rope_full,
            RopeSpec::Proportional {
                theta: 1_000_000.0,
                rotated: 8,
                factor: 1.0
            },
            "mlx-lm's default block"
        );
        assert_eq!(c.softcap, Some(30.0));
    }

    #[test]
    fn transformers_per_layer_overrides_replace_the_global_head_rules() {
        // As transformers 5.24's `save_pretrained` writes a config made with
        // `global_head_dim` 32 and `num_global_key_value_heads` 1: no
        // `global_head_dim` key, the full layer's values under its index.
        let mut c = text(serde_json::json!({
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "attention_k_eq_v": true,
            "per_layer_config": {"2": {"head_dim": 32, "num_key_value_heads": 1}, "4": {"head_dim": 32, "num_key_value_heads": 1}},
        }));
        if let Some(map) = c.as_object_mut() {
            map.remove("global_head_dim");
        }
        let c = parse(c).expect("parse");
        let dims: Vec<(i32, i32)> = c.layers.iter().map(|l| (l.head_dim, l.kv_heads)).collect();
        assert_eq!(dims, [(16, 2), (16, 2), (32, 1), (16, 2), (32, 1)]);
        assert!(matches!(
            c.rope_full,
            RopeSpec::Proportional { rotated: 8, .. }
        ));
        assert_eq!(
            c.rope_sliding,
            RopeSpec::Base {
                theta: 10_000.0,
                scale: 1.0
            }
        );

        for (overrides, needle) in [
            (
                serde_json::json!({"9": {"head_dim": 8}}),
                "not a layer index below 5",
            ),
            (
                serde_json::json!({"2": {"intermediate_size": 8}}),
                "overriding `intermediate_size`",
            ),
            (
                serde_json::json!({"2": {"head_dim": -8}}),
                "per_layer_config.2.head_dim must be a positive",
            ),
            (
                serde_json::json!({"2": {"head_dim": 64}}),
                "head widths 64 and 16",
            ),
        ] {
            let layer_types = serde_json::json!([
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention"
            ]);
            let err = parse(text(
                serde_json::json!({"layer_types": layer_types, "per_layer_config": overrides}),
            ))
            .expect_err(needle)
            .to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn the_wrapper_reads_text_config_with_its_own_vocabulary() {
        let c = parse(serde_json::json!({"model_type": "gemma4", "vocab_size": 99, "text_config": text(serde_json::json!({}))})).expect("parse");
        assert_eq!((c.model_type.as_str(), c.vocab), ("gemma4", 99));
        // transformers 5.24 writes the vocabulary only in `text_config`.
        let c = parse(
            serde_json::json!({"model_type": "gemma4", "text_config": text(serde_json::json!({}))}),
        )
        .expect("parse");
        assert_eq!(c.vocab, 320);
        let c = parse(serde_json::json!({"model_type": "gemma4", "text_config": {"model_type": "gemma4_text"}}))
            .expect("parse");
        assert_eq!(c.vocab, 262_144, "mlx-lm's default when neither has one");
    }

    #[test]
    fn unsupported_configs_name_the_problem() {
        for (extra, needle) in [
            (
                serde_json::json!({"enable_moe_block": true}),
                "needs a positive num_experts",
            ),
            (
                serde_json::json!({"enable_moe_block": true, "num_experts": 2, "top_k_experts": 3, "moe_intermediate_size": 8}),
                "exceeds num_experts",
            ),
            (
                serde_json::json!({"num_kv_shared_layers": 5}),
                "no layer with its own cache",
            ),
            (
                serde_json::json!({"layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "sliding_attention"], "num_kv_shared_layers": 1}),
                "no earlier non-shared layer",
            ),
            (
                serde_json::json!({"layer_types": ["sliding_attention"]}),
                "layer_types has 1 entries",
            ),
            (
                serde_json::json!({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}),
                "yarn",
            ),
            (serde_json::json!({"hidden_activation": "relu"}), "relu"),
            (
                serde_json::json!({"num_key_value_heads": 3}),
                "not a multiple",
            ),
        ] {
            let err = parse(text(extra)).expect_err(needle).to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
