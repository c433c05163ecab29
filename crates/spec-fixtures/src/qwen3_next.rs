//! The `qwen3_next` target layout with dense MLPs, in mlx-lm's saved form
//! (what `mlx_lm.convert` writes and loads without `sanitize` changing it:
//! depthwise conv weights `[channels, kernel, 1]`, norms as used). Every
//! `full_attention_interval`-th layer is gated full attention (a query
//! projection twice as wide, carrying the output gate), the others Gated
//! DeltaNet (`linear_attn.*`).

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Init, TensorSpec, BIAS_STD, EMBED_STD, GATE_SEED, NORM_STD, WEIGHT_STD};

/// One `qwen3_next` checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Qwen3Next {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `full_attention_interval`.
    pub interval: usize,
    /// `hidden_size`.
    pub hidden: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// `linear_num_key_heads`.
    pub linear_key_heads: usize,
    /// `linear_num_value_heads`.
    pub linear_value_heads: usize,
    /// `linear_key_head_dim`.
    pub linear_key_dim: usize,
    /// `linear_value_head_dim`.
    pub linear_value_dim: usize,
    /// `linear_conv_kernel_dim`.
    pub kernel: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `tie_word_embeddings`.
    pub tied: bool,
}

/// `qwen3-next`: four layers (three Gated DeltaNet, one gated attention),
/// two value heads per key head, a quarter of each attention head rotated,
/// an untied head.
pub const GATE: Qwen3Next = Qwen3Next {
    name: "qwen3-next",
    seed: GATE_SEED,
    layers: 4,
    interval: 4,
    hidden: 64,
    intermediate: 128,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    linear_key_heads: 2,
    linear_value_heads: 4,
    linear_key_dim: 16,
    linear_value_dim: 16,
    kernel: 4,
    vocab: 320,
    tied: false,
};

impl Qwen3Next {
    /// `self` at test size: vocabulary 96, seed `seed`.
    pub const fn tiny(self, seed: u64) -> Self {
        Self {
            seed,
            vocab: 96,
            ..self
        }
    }

    /// The `config.json`, with every key mlx-lm's `ModelArgs` requires.
    pub fn config(&self) -> Value {
        json!({
            "model_type": "qwen3_next",
            "architectures": ["Qwen3NextForCausalLM"],
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "linear_num_value_heads": self.linear_value_heads,
            "linear_num_key_heads": self.linear_key_heads,
            "linear_key_head_dim": self.linear_key_dim,
            "linear_value_head_dim": self.linear_value_dim,
            "linear_conv_kernel_dim": self.kernel,
            "num_experts": 0,
            "num_experts_per_tok": 0,
            "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 0,
            "mlp_only_layers": [],
            "moe_intermediate_size": 0,
            "rms_norm_eps": 1e-6,
            "vocab_size": self.vocab,
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.25,
            "max_position_embeddings": 512,
            "full_attention_interval": self.interval,
            "tie_word_embeddings": self.tied,
            "attention_bias": false,
        })
    }

    /// Every tensor, as mlx-lm names and shapes it.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (w, norm) = (Init::Normal(WEIGHT_STD), Init::OnePlusNormal(NORM_STD));
        let h = self.hidden;
        let keys = self.linear_key_heads * self.linear_key_dim;
        let values = self.linear_value_heads * self.linear_value_dim;
        let mut t = vec![TensorSpec::new(
            "model.embed_tokens.weight",
            vec![self.vocab, h],
            Init::Normal(EMBED_STD),
        )];
        for i in 0..self.layers {
            let l = format!("model.layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{l}.{name}"), shape, init))
            };
            add("input_layernorm.weight", vec![h], norm);
            add("post_attention_layernorm.weight", vec![h], norm);
            if (i + 1) % self.interval == 0 {
                let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
                add("self_attn.q_proj.weight", vec![2 * q, h], w);
                add("self_attn.k_proj.weight", vec![kv, h], w);
                add("self_attn.v_proj.weight", vec![kv, h], w);
                add("self_attn.o_proj.weight", vec![h, q], w);
                add("self_attn.q_norm.weight", vec![self.head_dim], norm);
                add("self_attn.k_norm.weight", vec![self.head_dim], norm);
            } else {
                let channels = 2 * keys + values;
                add(
                    "linear_attn.in_proj_qkvz.weight",
                    vec![2 * keys + 2 * values, h],
                    w,
                );
                add(
                    "linear_attn.in_proj_ba.weight",
                    vec![2 * self.linear_value_heads, h],
                    w,
                );
                add(
                    "linear_attn.conv1d.weight",
                    vec![channels, self.kernel, 1],
                    w,
                );
                add(
                    "linear_attn.dt_bias",
                    vec![self.linear_value_heads],
                    Init::Normal(BIAS_STD),
                );
                add(
                    "linear_attn.A_log",
                    vec![self.linear_value_heads],
                    Init::Normal(BIAS_STD),
                );
                add("linear_attn.norm.weight", vec![self.linear_value_dim], norm);
                add("linear_attn.out_proj.weight", vec![h, values], w);
            }
            add("mlp.gate_proj.weight", vec![self.intermediate, h], w);
            add("mlp.up_proj.weight", vec![self.intermediate, h], w);
            add("mlp.down_proj.weight", vec![h, self.intermediate], w);
        }
        t.push(TensorSpec::new("model.norm.weight", vec![h], norm));
        if !self.tied {
            t.push(TensorSpec::new("lm_head.weight", vec![self.vocab, h], w));
        }
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

    #[test]
    fn every_interval_th_layer_is_attention_and_the_rest_linear() {
        let names: Vec<String> = GATE.tensors().into_iter().map(|t| t.name).collect();
        for i in 0..GATE.layers {
            let full = (i + 1) % GATE.interval == 0;
            let has = |n: &str| names.iter().any(|x| x == &format!("model.layers.{i}.{n}"));
            assert_eq!(has("self_attn.q_proj.weight"), full, "layer {i}");
            assert_eq!(has("linear_attn.conv1d.weight"), !full, "layer {i}");
        }
        assert_eq!(GATE.config()["full_attention_interval"], GATE.interval);
    }
}
