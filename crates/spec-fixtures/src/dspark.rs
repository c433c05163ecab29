//! The DSpark drafter layout (DeepSpec's `Gemma4DSparkModel`): its
//! `config.json` (a `Gemma4TextConfig` plus the DSpark keys) and state-dict
//! tensor names: a block transformer over the target's tapped hidden states,
//! a rank-`markov_rank` Markov head and a confidence head.

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Init, TensorSpec, BIAS_STD, EMBED_STD, NORM_STD, WEIGHT_STD};

/// Seed of the gates' DSpark drafters.
pub const GATE_SEED: u64 = 0x6473_7061_726B_0001;

/// One DSpark drafter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dspark {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// `hidden_size` (the target's).
    pub hidden: usize,
    /// `num_hidden_layers` of the drafter.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_global_key_value_heads`.
    pub kv_heads: usize,
    /// `global_head_dim`.
    pub head_dim: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `vocab_size` (the target's).
    pub vocab: usize,
    /// `block_size`: drafts per block (the anchor position proposes too).
    pub block_size: usize,
    /// `mask_token_id`.
    pub mask_token: usize,
    /// `markov_rank`.
    pub markov_rank: usize,
    /// `target_layer_ids`: the target layers whose hidden states are tapped.
    pub taps: &'static [usize],
    /// `num_target_layers`.
    pub target_layers: usize,
    /// `partial_rotary_factor` of the (full-attention) RoPE.
    pub partial_rotary: f64,
    /// Writes the keys DeepSpec saves that a loader does not need
    /// (`architectures` aside): `attention_bias`, `num_anchors`,
    /// `enable_moe_block`, `hidden_size_per_layer_input`, the sliding RoPE
    /// parameters and `torch_dtype`.
    pub hub_extras: bool,
}

/// The gates' drafter for the synthetic `llama` target (2 layers, taps 0, 1).
pub const GATE_LLAMA: Dspark = Dspark {
    name: "dspark-llama",
    seed: GATE_SEED,
    hidden: 64,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    intermediate: 128,
    vocab: 320,
    block_size: 4,
    mask_token: 4,
    markov_rank: 64,
    taps: &[0, 1],
    target_layers: 2,
    partial_rotary: 0.25,
    hub_extras: true,
};

/// The gates' drafter for the synthetic `gemma4-text` target (4 layers,
/// taps 1, 2).
pub const GATE_GEMMA4: Dspark = Dspark {
    name: "dspark-gemma4",
    taps: &[1, 2],
    target_layers: 4,
    ..GATE_LLAMA
};

impl Dspark {
    /// A tiny drafter for tests: hidden 32, vocabulary 64, rank 32, block 4,
    /// taps 0 and 2 of a 3-layer target.
    pub const fn tiny() -> Self {
        Self {
            name: "tiny-dspark",
            seed: 1000,
            hidden: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 64,
            vocab: 64,
            block_size: 4,
            mask_token: 3,
            markov_rank: 32,
            taps: &[0, 2],
            target_layers: 3,
            partial_rotary: 0.5,
            hub_extras: false,
        }
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        let mut c = json!({
            "architectures": ["Gemma4DSparkModel"],
            "model_type": "gemma4_text",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "global_head_dim": self.head_dim,
            "num_global_key_value_heads": self.kv_heads,
            "attention_k_eq_v": true,
            "intermediate_size": self.intermediate,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0,
            "vocab_size": self.vocab,
            "block_size": self.block_size,
            "mask_token_id": self.mask_token,
            "target_layer_ids": self.taps,
            "num_target_layers": self.target_layers,
            "markov_rank": self.markov_rank,
            "markov_head_type": "vanilla",
            "enable_confidence_head": true,
            "confidence_head_with_markov": true,
            "rope_parameters": {
                "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": self.partial_rotary},
            },
        });
        if let (true, Some(map)) = (self.hub_extras, c.as_object_mut()) {
            map.insert("attention_bias".into(), json!(false));
            map.insert("num_anchors".into(), json!(512));
            map.insert("enable_moe_block".into(), json!(false));
            map.insert("hidden_size_per_layer_input".into(), json!(0));
            map.insert("torch_dtype".into(), json!("float32"));
            c["rope_parameters"]["sliding_attention"] =
                json!({"rope_type": "default", "rope_theta": 10000.0});
        }
        c
    }

    /// Every tensor, named as DeepSpec's `Gemma4DSparkModel` state dict
    /// names it.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (w, norm) = (Init::Normal(WEIGHT_STD), Init::OnePlusNormal(NORM_STD));
        let (h, v, r, inter) = (self.hidden, self.vocab, self.markov_rank, self.intermediate);
        let (q_out, kv_out) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut t = vec![
            TensorSpec::new("embed_tokens.weight", vec![v, h], Init::Normal(EMBED_STD)),
            TensorSpec::new("fc.weight", vec![h, self.taps.len() * h], w),
            TensorSpec::new("hidden_norm.weight", vec![h], norm),
        ];
        for i in 0..self.layers {
            let p = format!("layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{p}.{name}"), shape, init))
            };
            add("self_attn.q_proj.weight", vec![q_out, h], w);
            add("self_attn.k_proj.weight", vec![kv_out, h], w);
            add("self_attn.o_proj.weight", vec![h, q_out], w);
            add("self_attn.q_norm.weight", vec![self.head_dim], norm);
            add("self_attn.k_norm.weight", vec![self.head_dim], norm);
            for norm_name in [
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ] {
                add(&format!("{norm_name}.weight"), vec![h], norm);
            }
            add("mlp.gate_proj.weight", vec![inter, h], w);
            add("mlp.up_proj.weight", vec![inter, h], w);
            add("mlp.down_proj.weight", vec![h, inter], w);
            add("layer_scalar", vec![1], norm);
        }
        let head = Init::Normal(BIAS_STD);
        t.extend([
            TensorSpec::new("norm.weight", vec![h], norm),
            TensorSpec::new("lm_head.weight", vec![v, h], w),
            TensorSpec::new("markov_head.markov_w1.weight", vec![v, r], w),
            TensorSpec::new("markov_head.markov_w2.weight", vec![v, r], w),
            TensorSpec::new("confidence_head.proj.weight", vec![1, h + r], head),
            TensorSpec::new("confidence_head.proj.bias", vec![1], head),
        ]);
        t
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (which must
    /// exist).
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        crate::write_checkpoint(dir, &self.config(), &self.tensors(), self.seed, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes re-derived from the config alone, as DeepSpec's modeling file
    /// builds its modules.
    #[test]
    fn tensors_match_what_the_config_implies() {
        for spec in [GATE_LLAMA, GATE_GEMMA4, Dspark::tiny()] {
            check_spec(&spec);
        }
    }

    fn check_spec(spec: &Dspark) {
        let c = spec.config();
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
        let (h, v, r, hd) = (
            n("hidden_size"),
            n("vocab_size"),
            n("markov_rank"),
            n("global_head_dim"),
        );
        let taps = c["target_layer_ids"].as_array().expect("taps").len();
        let shapes: std::collections::HashMap<String, Vec<usize>> = spec
            .tensors()
            .into_iter()
            .map(|s| (s.name, s.shape))
            .collect();
        assert_eq!(shapes["fc.weight"], vec![h, taps * h]);
        assert_eq!(shapes["markov_head.markov_w1.weight"], vec![v, r]);
        assert_eq!(shapes["markov_head.markov_w2.weight"], vec![v, r]);
        assert_eq!(shapes["confidence_head.proj.weight"], vec![1, h + r]);
        for i in 0..n("num_hidden_layers") {
            assert_eq!(
                shapes[&format!("layers.{i}.self_attn.k_proj.weight")],
                vec![n("num_global_key_value_heads") * hd, h]
            );
            assert_eq!(
                shapes[&format!("layers.{i}.self_attn.q_proj.weight")],
                vec![n("num_attention_heads") * hd, h]
            );
            assert_eq!(
                shapes[&format!("layers.{i}.mlp.down_proj.weight")],
                vec![h, n("intermediate_size")]
            );
            assert!(
                !shapes.contains_key(&format!("layers.{i}.self_attn.v_proj.weight")),
                "attention_k_eq_v: no v_proj"
            );
        }
        assert_eq!(shapes.len(), 3 + 13 * n("num_hidden_layers") + 6);
    }
}
