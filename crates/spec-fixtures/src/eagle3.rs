//! EAGLE-3 heads in the layout SpecForge and the EAGLE authors publish
//! (`LlamaForCausalLMEagle3`: `fc`, `midlayer.*`, `norm`, `lm_head`, the
//! `d2t` / `t2d` vocabulary maps; no embedding of their own unless asked),
//! and the four-layer llama target they are drawn for (three distinct
//! fused layers need at least four).

use std::path::Path;

use serde_json::{json, Value};

use crate::llama::{Llama, GATE_LLAMA};
use crate::write::{write_config, write_tensors, Data, Tensor};
use crate::{Error, Init, TensorSpec, EMBED_STD, GATE_SEED, NORM_STD, WEIGHT_STD};

/// The target the gate's head is drawn for: the gate llama, four layers.
pub const TARGET: Llama = Llama {
    name: "eagle3-target",
    layers: 4,
    ..GATE_LLAMA
};

/// One EAGLE-3 head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eagle3Head {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// `hidden_size` (and the target's).
    pub hidden: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `vocab_size` (the target's).
    pub vocab: usize,
    /// `draft_vocab_size`.
    pub draft_vocab: usize,
    /// `eagle_config.eagle_aux_hidden_state_layer_ids`.
    pub aux: [usize; 3],
    /// `fc_norm`.
    pub fc_norm: bool,
    /// An `embed_tokens` of its own.
    pub embedding: bool,
}

/// The gate's head for [`TARGET`]: the inputs of layers 1, 2 and 3, a
/// draft vocabulary of 96 of the target's 320 tokens.
pub const GATE: Eagle3Head = Eagle3Head {
    name: "eagle3",
    seed: GATE_SEED,
    hidden: 64,
    heads: 4,
    kv_heads: 2,
    intermediate: 128,
    vocab: 320,
    draft_vocab: 96,
    aux: [1, 2, 3],
    fc_norm: false,
    embedding: false,
};

impl Eagle3Head {
    /// The target id of draft id `i`: spread over the vocabulary, in order
    /// (one id of each `vocab / draft_vocab` consecutive ones).
    pub fn target_id(&self, i: usize) -> usize {
        let spread = (self.vocab / self.draft_vocab.max(1)).max(1);
        i * spread + i % spread
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_scaling": null,
            "max_position_embeddings": 512,
            "vocab_size": self.vocab,
            "draft_vocab_size": self.draft_vocab,
            "tie_word_embeddings": false,
            "fc_norm": self.fc_norm,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.aux},
            "torch_dtype": "float32",
        })
    }

    /// Every random tensor (the maps are [`Eagle3Head::maps`]).
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let w = Init::Normal(WEIGHT_STD);
        let norm = Init::OnePlusNormal(NORM_STD);
        let h = self.hidden;
        let head_dim = h / self.heads;
        let (q, kv) = (self.heads * head_dim, self.kv_heads * head_dim);
        let mut t = vec![
            TensorSpec::new("fc.weight", vec![h, 3 * h], w),
            TensorSpec::new("norm.weight", vec![h], norm),
            TensorSpec::new("lm_head.weight", vec![self.draft_vocab, h], w),
        ];
        let mut add = |name: &str, shape: Vec<usize>, init| {
            t.push(TensorSpec::new(format!("midlayer.{name}"), shape, init))
        };
        add("input_layernorm.weight", vec![h], norm);
        add("hidden_norm.weight", vec![h], norm);
        add("post_attention_layernorm.weight", vec![h], norm);
        add("self_attn.q_proj.weight", vec![q, 2 * h], w);
        add("self_attn.k_proj.weight", vec![kv, 2 * h], w);
        add("self_attn.v_proj.weight", vec![kv, 2 * h], w);
        add("self_attn.o_proj.weight", vec![h, q], w);
        add("mlp.gate_proj.weight", vec![self.intermediate, h], w);
        add("mlp.up_proj.weight", vec![self.intermediate, h], w);
        add("mlp.down_proj.weight", vec![h, self.intermediate], w);
        if self.fc_norm {
            for i in 0..3 {
                t.push(TensorSpec::new(
                    format!("fc_norm.{i}.weight"),
                    vec![h],
                    norm,
                ));
            }
        }
        if self.embedding {
            t.push(TensorSpec::new(
                "embed_tokens.weight",
                vec![self.vocab, h],
                Init::Normal(EMBED_STD),
            ));
        }
        t
    }

    /// `d2t` (target id minus draft id, per draft id) and `t2d` (which
    /// target ids the head proposes).
    pub fn maps(&self) -> [Tensor; 2] {
        let ids: Vec<usize> = (0..self.draft_vocab).map(|i| self.target_id(i)).collect();
        let d2t = ids
            .iter()
            .enumerate()
            .map(|(i, &t)| t as i64 - i as i64)
            .collect();
        let mut t2d = vec![false; self.vocab];
        for &t in &ids {
            t2d[t] = true;
        }
        [
            Tensor {
                name: "d2t".into(),
                shape: vec![self.draft_vocab],
                data: Data::I64(d2t),
            },
            Tensor {
                name: "t2d".into(),
                shape: vec![self.vocab],
                data: Data::Bool(t2d),
            },
        ]
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (which must
    /// exist).
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        write_config(dir, &self.config())?;
        let mut tensors: Vec<Tensor> = self
            .tensors()
            .iter()
            .map(|s| s.draw(self.seed, self.name))
            .collect();
        tensors.extend(self.maps());
        write_tensors(&dir.join("model.safetensors"), &tensors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_vocabulary_maps_into_the_target_s_in_order() {
        let ids: Vec<usize> = (0..GATE.draft_vocab).map(|i| GATE.target_id(i)).collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "increasing, so distinct"
        );
        assert!(ids.iter().all(|&t| t < GATE.vocab));
        let [_, t2d] = GATE.maps();
        let Data::Bool(mask) = t2d.data else {
            panic!("bool")
        };
        assert_eq!(mask.iter().filter(|&&x| x).count(), GATE.draft_vocab);
    }
}
