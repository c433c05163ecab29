//! The hybrid Qwen target layouts, dense or with expert layers: `qwen3_next` in mlx-lm's
//! saved form (what `mlx_lm.convert` writes and loads without `sanitize`
//! changing it: depthwise conv weights `[channels, kernel, 1]`, norms as
//! used, fused `in_proj_qkvz` / `in_proj_ba`), and `qwen3_5` as a Hugging
//! Face multimodal checkpoint stores it (`text_config`, tensors under
//! `model.language_model.`, split `in_proj_qkv` / `_z` / `_b` / `_a`, conv
//! weights `[channels, 1, kernel]`, zero-centred norm scales, a vision tower
//! and an MTP head, which mlx-lm drops and `qwen3-native-mtp` drafts with). Every
//! `full_attention_interval`-th layer is gated full attention (a query
//! projection twice as wide, carrying the output gate), the others Gated
//! DeltaNet (`linear_attn.*`). With [`Experts`], `qwen3_next`'s every
//! `decoder_sparse_step`-th layer is an expert block in mlx-lm's switch
//! layout (`mlp.switch_mlp.*` stacked per expert), and `qwen3_5` becomes
//! `qwen3_5_moe` with every layer an expert block as Hugging Face stores it
//! (`mlp.experts.gate_up_proj` fused, `mlp.experts.down_proj`); both with a
//! router (`mlp.gate`) and a gated shared expert.

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
    /// `qwen3_5` in the Hugging Face multimodal layout instead of
    /// `qwen3_next` in mlx-lm's.
    pub qwen3_5: bool,
    /// Expert layers, if any.
    pub experts: Option<Experts>,
}

/// The expert blocks of a [`Qwen3Next`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experts {
    /// `num_experts`.
    pub count: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `moe_intermediate_size`.
    pub intermediate: usize,
    /// `shared_expert_intermediate_size`.
    pub shared_intermediate: usize,
    /// `decoder_sparse_step` (`qwen3_next` only: every layer of `qwen3_5_moe`
    /// is an expert block).
    pub sparse_step: usize,
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
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
    qwen3_5: false,
    experts: None,
};

/// `qwen3-5`: the same stack as a `qwen3_5` multimodal checkpoint.
pub const GATE_QWEN3_5: Qwen3Next = Qwen3Next {
    name: "qwen3-5",
    qwen3_5: true,
    ..GATE
};

/// `qwen3-next-moe`: [`GATE`] with eight experts, four picked per token
/// (16 prompt tokens make the 64 picks after which mlx-lm sorts them by
/// expert), on every second layer; the others keep the dense MLP.
pub const GATE_MOE: Qwen3Next = Qwen3Next {
    name: "qwen3-next-moe",
    experts: Some(Experts {
        count: 8,
        top_k: 4,
        intermediate: 32,
        shared_intermediate: 48,
        sparse_step: 2,
        norm_topk_prob: false,
    }),
    ..GATE
};

/// `qwen3-5-moe`: [`GATE_QWEN3_5`] as `qwen3_5_moe`, every layer an expert
/// block, the picked probabilities renormalised.
pub const GATE_QWEN3_5_MOE: Qwen3Next = Qwen3Next {
    name: "qwen3-5-moe",
    experts: Some(Experts {
        count: 8,
        top_k: 4,
        intermediate: 32,
        shared_intermediate: 48,
        sparse_step: 1,
        norm_topk_prob: true,
    }),
    ..GATE_QWEN3_5
};

impl Qwen3Next {
    /// Whether layer `i` is an expert block.
    pub fn sparse(&self, i: usize) -> bool {
        match self.experts {
            Some(_) if self.qwen3_5 => true,
            Some(e) => (i + 1) % e.sparse_step.max(1) == 0,
            None => false,
        }
    }

    /// `self` at test size: vocabulary 96, seed `seed`.
    pub const fn tiny(self, seed: u64) -> Self {
        Self {
            seed,
            vocab: 96,
            ..self
        }
    }

    /// The `config.json`: every key mlx-lm's `qwen3_next.ModelArgs`
    /// requires, or a `qwen3_5` wrapper with its `text_config`.
    pub fn config(&self) -> Value {
        let mut text = json!({
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
            "rms_norm_eps": 1e-6,
            "vocab_size": self.vocab,
            "max_position_embeddings": 512,
            "full_attention_interval": self.interval,
            "tie_word_embeddings": self.tied,
            "attention_bias": false,
        });
        let e = self.experts;
        let experts = e.map_or(0, |e| e.count);
        let extra = if self.qwen3_5 {
            json!({
                "model_type": if e.is_some() { "qwen3_5_moe_text" } else { "qwen3_5_text" },
                "num_experts": experts,
                "num_experts_per_tok": e.map_or(0, |e| e.top_k),
                "moe_intermediate_size": e.map_or(0, |e| e.intermediate),
                "shared_expert_intermediate_size": e.map_or(0, |e| e.shared_intermediate),
                "norm_topk_prob": e.is_none_or(|e| e.norm_topk_prob),
                "rope_parameters": {
                    "rope_type": "default",
                    "mrope_section": [1, 1, 0],
                    "mrope_interleaved": true,
                    "rope_theta": 10_000.0,
                    "partial_rotary_factor": 0.25,
                },
            })
        } else {
            json!({
                "model_type": "qwen3_next",
                "architectures": ["Qwen3NextForCausalLM"],
                "num_experts": experts,
                "num_experts_per_tok": e.map_or(0, |e| e.top_k),
                "decoder_sparse_step": e.map_or(1, |e| e.sparse_step),
                "shared_expert_intermediate_size": e.map_or(0, |e| e.shared_intermediate),
                "mlp_only_layers": [],
                "moe_intermediate_size": e.map_or(0, |e| e.intermediate),
                "norm_topk_prob": e.is_some_and(|e| e.norm_topk_prob),
                "rope_theta": 10_000.0,
                "partial_rotary_factor": 0.25,
            })
        };
        if let (Some(t), Some(e)) = (text.as_object_mut(), extra.as_object()) {
            t.extend(e.clone());
        }
        if !self.qwen3_5 {
            return text;
        }
        let (model_type, architecture) = match e {
            Some(_) => ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
            None => ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
        };
        json!({
            "model_type": model_type,
            "architectures": [architecture],
            "text_config": text,
            "vision_config": {"depth": 1},
            "tie_word_embeddings": self.tied,
        })
    }

    /// Every tensor, as the layout names and shapes it.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let w = Init::Normal(WEIGHT_STD);
        // Hugging Face's Qwen3.5 stores norm scales zero-centred.
        let norm = if self.qwen3_5 {
            Init::Normal(NORM_STD)
        } else {
            Init::OnePlusNormal(NORM_STD)
        };
        let root = if self.qwen3_5 {
            "model.language_model"
        } else {
            "model"
        };
        let h = self.hidden;
        let keys = self.linear_key_heads * self.linear_key_dim;
        let values = self.linear_value_heads * self.linear_value_dim;
        let nv = self.linear_value_heads;
        let mut t = vec![TensorSpec::new(
            format!("{root}.embed_tokens.weight"),
            vec![self.vocab, h],
            Init::Normal(EMBED_STD),
        )];
        for i in 0..self.layers {
            let l = format!("{root}.layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{l}.{name}"), shape, init))
            };
            add("input_layernorm.weight", vec![h], norm);
            add("post_attention_layernorm.weight", vec![h], norm);
            if (i + 1) % self.interval == 0 {
                self.attention(&mut add, norm);
            } else {
                let channels = 2 * keys + values;
                if self.qwen3_5 {
                    add("linear_attn.in_proj_qkv.weight", vec![channels, h], w);
                    add("linear_attn.in_proj_z.weight", vec![values, h], w);
                    add("linear_attn.in_proj_b.weight", vec![nv, h], w);
                    add("linear_attn.in_proj_a.weight", vec![nv, h], w);
                    add(
                        "linear_attn.conv1d.weight",
                        vec![channels, 1, self.kernel],
                        w,
                    );
                } else {
                    add(
                        "linear_attn.in_proj_qkvz.weight",
                        vec![2 * keys + 2 * values, h],
                        w,
                    );
                    add("linear_attn.in_proj_ba.weight", vec![2 * nv, h], w);
                    add(
                        "linear_attn.conv1d.weight",
                        vec![channels, self.kernel, 1],
                        w,
                    );
                }
                add("linear_attn.dt_bias", vec![nv], Init::Normal(BIAS_STD));
                add("linear_attn.A_log", vec![nv], Init::Normal(BIAS_STD));
                // The gated norm's scale is used as stored in both layouts.
                add(
                    "linear_attn.norm.weight",
                    vec![self.linear_value_dim],
                    Init::OnePlusNormal(NORM_STD),
                );
                add("linear_attn.out_proj.weight", vec![h, values], w);
            }
            self.mlp(&mut add, self.sparse(i));
        }
        t.push(TensorSpec::new(
            format!("{root}.norm.weight"),
            vec![h],
            norm,
        ));
        if !self.tied {
            t.push(TensorSpec::new("lm_head.weight", vec![self.vocab, h], w));
        }
        if self.qwen3_5 {
            // A vision tower, which text loaders drop.
            t.push(TensorSpec::new(
                "model.visual.patch_embed.proj.weight",
                vec![4, 4],
                w,
            ));
            // The MTP head (its layer full attention, its MLP as the
            // stack's: experts for `qwen3_5_moe`).
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("mtp.{name}"), shape, init))
            };
            add("fc.weight", vec![h, 2 * h], w);
            for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"] {
                add(&format!("{n}.weight"), vec![h], norm);
            }
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("mtp.layers.0.{name}"), shape, init))
            };
            add("input_layernorm.weight", vec![h], norm);
            add("post_attention_layernorm.weight", vec![h], norm);
            self.attention(&mut add, norm);
            self.mlp(&mut add, self.experts.is_some());
        }
        t
    }

    /// A gated full attention block's tensors (`self_attn.*`).
    fn attention(&self, add: &mut impl FnMut(&str, Vec<usize>, Init), norm: Init) {
        let w = Init::Normal(WEIGHT_STD);
        let h = self.hidden;
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        add("self_attn.q_proj.weight", vec![2 * q, h], w);
        add("self_attn.k_proj.weight", vec![kv, h], w);
        add("self_attn.v_proj.weight", vec![kv, h], w);
        add("self_attn.o_proj.weight", vec![h, q], w);
        add("self_attn.q_norm.weight", vec![self.head_dim], norm);
        add("self_attn.k_norm.weight", vec![self.head_dim], norm);
    }

    /// A layer's feed-forward tensors (`mlp.*`): an expert block when
    /// `sparse` (and the model has experts), else the dense MLP.
    fn mlp(&self, add: &mut impl FnMut(&str, Vec<usize>, Init), sparse: bool) {
        let w = Init::Normal(WEIGHT_STD);
        let h = self.hidden;
        match self.experts.filter(|_| sparse) {
            Some(e) => {
                let (n, m, s) = (e.count, e.intermediate, e.shared_intermediate);
                add("mlp.gate.weight", vec![n, h], w);
                if self.qwen3_5 {
                    add("mlp.experts.gate_up_proj", vec![n, 2 * m, h], w);
                    add("mlp.experts.down_proj", vec![n, h, m], w);
                } else {
                    add("mlp.switch_mlp.gate_proj.weight", vec![n, m, h], w);
                    add("mlp.switch_mlp.up_proj.weight", vec![n, m, h], w);
                    add("mlp.switch_mlp.down_proj.weight", vec![n, h, m], w);
                }
                add("mlp.shared_expert.gate_proj.weight", vec![s, h], w);
                add("mlp.shared_expert.up_proj.weight", vec![s, h], w);
                add("mlp.shared_expert.down_proj.weight", vec![h, s], w);
                add("mlp.shared_expert_gate.weight", vec![1, h], w);
            }
            None => {
                add("mlp.gate_proj.weight", vec![self.intermediate, h], w);
                add("mlp.up_proj.weight", vec![self.intermediate, h], w);
                add("mlp.down_proj.weight", vec![h, self.intermediate], w);
            }
        }
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

    #[test]
    fn the_qwen3_5_layout_is_a_multimodal_checkpoint() {
        let c = GATE_QWEN3_5.config();
        assert_eq!(c["model_type"], "qwen3_5");
        assert_eq!(c["text_config"]["linear_conv_kernel_dim"], GATE.kernel);
        let names: Vec<String> = GATE_QWEN3_5.tensors().into_iter().map(|t| t.name).collect();
        assert!(names
            .iter()
            .any(|n| n == "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"));
        assert!(
            names.iter().any(|n| n.starts_with("mtp."))
                && names.iter().any(|n| n.starts_with("model.visual."))
        );
    }
}
