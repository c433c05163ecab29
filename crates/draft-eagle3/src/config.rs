//! The `config.json` of an EAGLE-3 head (`LlamaForCausalLMEagle3`, as
//! SpecForge and the EAGLE authors publish them), read key by key: a
//! missing key, a value of the wrong type and a value we do not implement
//! are each an error naming the key. Hugging Face bookkeeping keys are
//! ignored.

use std::path::{Path, PathBuf};

use serde_json::Value;
use spec_runtime::config::Quantization;
use spec_runtime::config_keys::Keys;
use spec_runtime::ModelError;

/// The architecture name EAGLE-3 heads carry.
pub const ARCHITECTURE: &str = "LlamaForCausalLMEagle3";

/// A validated EAGLE-3 configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Eagle3Config {
    /// The head's hidden width.
    pub hidden: i32,
    /// The target's hidden width (each fused feature's width).
    pub target_hidden: i32,
    /// Query heads.
    pub heads: i32,
    /// Key/value heads.
    pub kv_heads: i32,
    /// Per-head width.
    pub head_dim: i32,
    /// MLP width.
    pub intermediate: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// The target's vocabulary.
    pub vocab: i32,
    /// The head's own (reduced) vocabulary.
    pub draft_vocab: i32,
    /// `rope_theta`.
    pub rope_theta: f32,
    /// `rope_scaling`, as given.
    pub rope_scaling: Option<Value>,
    /// Each fused feature normed before `fc` (`fc_norm`).
    pub fc_norm: bool,
    /// The head's output normed before its `lm_head` (`norm_output`).
    pub norm_output: bool,
    /// `eagle_config.eagle_aux_hidden_state_layer_ids`: the target layers
    /// whose *inputs* are fused (low, mid, high); `None`: vLLM's default
    /// `(2, layers / 2, layers - 3)` for the target at hand.
    pub aux_layer_ids: Option<Vec<usize>>,
    /// `max_position_embeddings`.
    pub context_length: usize,
    /// Quantization block, if the head was quantized.
    pub quantization: Quantization,
}

fn bad(path: &Path, message: String) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        message,
    }
}

impl Eagle3Config {
    /// Reads `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        let path: PathBuf = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| bad(&path, format!("not JSON: {e}")))?;
        Self::parse(&value, &path)
    }

    /// Validates a parsed config (`path` names it in errors).
    pub fn parse(value: &Value, path: &Path) -> Result<Self, ModelError> {
        let map = value
            .as_object()
            .ok_or_else(|| bad(path, "the config is not a JSON object".into()))?;
        let k = Keys::<ModelError>::new(map, path);
        let archs = k.opt("architectures").and_then(Value::as_array);
        if !archs.is_some_and(|a| a.iter().any(|x| x.as_str() == Some(ARCHITECTURE))) {
            return Err(bad(
                path,
                format!("`architectures` must name {ARCHITECTURE} (an EAGLE-3 head)"),
            ));
        }
        let layers = k.positive_or("num_hidden_layers", 1)?;
        if layers != 1 {
            return Err(k.unsupported(
                "num_hidden_layers",
                &Value::from(layers),
                "1: EAGLE-3 heads have one decoder layer",
            ));
        }
        if let Some(act) = k.opt("hidden_act").filter(|a| a.as_str() != Some("silu")) {
            return Err(k.unsupported("hidden_act", act, "silu"));
        }
        for key in ["attention_bias", "mlp_bias", "tie_word_embeddings"] {
            if k.boolean_or(key, false)? {
                return Err(k.unsupported(key, &Value::Bool(true), "false"));
            }
        }
        let hidden = k.positive("hidden_size")?;
        let heads = k.positive("num_attention_heads")?;
        let kv_heads = k.positive_or("num_key_value_heads", heads)?;
        if heads % kv_heads != 0 {
            return Err(k.invalid(
                "num_key_value_heads",
                format!("{kv_heads} does not divide `num_attention_heads` {heads}"),
            ));
        }
        let head_dim = match k.opt("head_dim") {
            Some(_) => k.positive("head_dim")?,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                let why = format!("{hidden} is not a multiple of `num_attention_heads` {heads}");
                return Err(k.invalid("hidden_size", format!("{why}: give `head_dim`")));
            }
        };
        let vocab = k.positive("vocab_size")?;
        let draft_vocab = k.positive_or("draft_vocab_size", vocab)?;
        if draft_vocab > vocab {
            return Err(k.invalid(
                "draft_vocab_size",
                format!("{draft_vocab} exceeds `vocab_size` {vocab}"),
            ));
        }
        let target_hidden = k.positive_or("target_hidden_size", hidden)?;
        let aux_layer_ids = match k.nested("eagle_config")? {
            Some(e) if e.opt("eagle_aux_hidden_state_layer_ids").is_some() => {
                let key = "eagle_aux_hidden_state_layer_ids";
                let v = e.get(key)?;
                let ids: Option<Vec<usize>> = v.as_array().and_then(|ids| {
                    ids.iter()
                        .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
                        .collect()
                });
                match ids {
                    Some(ids) if ids.len() == 3 => Some(ids),
                    _ => {
                        return Err(e.invalid(key, format!("expected three layer indices, got {v}")))
                    }
                }
            }
            _ => None,
        };
        let context = k.positive_or("max_position_embeddings", 8192)?;
        Ok(Self {
            hidden,
            target_hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate: k.positive("intermediate_size")?,
            eps: k.float_or("rms_norm_eps", 1e-6)? as f32,
            vocab,
            draft_vocab,
            rope_theta: k.float_or("rope_theta", 10_000.0)? as f32,
            rope_scaling: k.opt("rope_scaling").cloned(),
            fc_norm: k.boolean_or("fc_norm", false)?,
            norm_output: k.boolean_or("norm_output", true)?,
            aux_layer_ids,
            context_length: context as usize,
            quantization: Quantization::of_config(value, path)?,
        })
    }

    /// The target layers whose inputs are fused, for a target of `layers`
    /// decoder layers: the configured ones or vLLM's default.
    pub fn aux_layers(&self, layers: usize) -> Vec<usize> {
        self.aux_layer_ids
            .clone()
            .unwrap_or_else(|| vec![2, layers / 2, layers.saturating_sub(3)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": [ARCHITECTURE],
            "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 320, "draft_vocab_size": 96,
            "rms_norm_eps": 1e-5, "num_hidden_layers": 1,
        })
    }

    fn parse(v: Value) -> Result<Eagle3Config, ModelError> {
        Eagle3Config::parse(&v, Path::new("config.json"))
    }

    #[test]
    fn reads_a_published_shape_with_defaults() {
        let c = parse(base()).expect("config");
        assert_eq!((c.head_dim, c.target_hidden, c.draft_vocab), (16, 64, 96));
        assert!(c.norm_output && !c.fc_norm);
        assert_eq!(c.aux_layers(32), [2, 16, 29], "vLLM's default");
        let mut v = base();
        v["eagle_config"] = json!({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]});
        assert_eq!(parse(v).expect("config").aux_layers(32), [1, 2, 3]);
    }

    #[test]
    fn every_bad_key_is_named() {
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "architectures",
                json!(["LlamaForCausalLM"]),
                "architectures",
            ),
            ("num_hidden_layers", json!(2), "num_hidden_layers"),
            ("hidden_act", json!("gelu"), "hidden_act"),
            ("draft_vocab_size", json!(400), "draft_vocab_size"),
            ("num_key_value_heads", json!(3), "num_key_value_heads"),
            ("hidden_size", json!("64"), "hidden_size"),
            (
                "eagle_config",
                json!({"eagle_aux_hidden_state_layer_ids": [1, 2]}),
                "eagle_aux_hidden_state_layer_ids",
            ),
            ("tie_word_embeddings", json!(true), "tie_word_embeddings"),
        ];
        for (key, value, named) in cases {
            let mut v = base();
            v[key] = value;
            let e = parse(v).expect_err(key);
            assert!(e.to_string().contains(named), "{key}: {e}");
        }
        let mut v = base();
        v.as_object_mut()
            .expect("object")
            .remove("intermediate_size");
        assert!(parse(v)
            .expect_err("missing")
            .to_string()
            .contains("intermediate_size"));
    }
}
