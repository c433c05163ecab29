//! Tiny random `glm_moe_dsa` checkpoints for tests (feature `test-support`):
//! the real config schema and tensor names, dimensions small enough to run
//! hundreds of forwards in a second. The gates use the fixed-seed ones that
//! `cargo xtask synth` writes; these are for unit and scenario tests.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;

use crate::ModelError;

/// What to write.
#[derive(Debug, Clone)]
pub struct TinyGlm {
    /// Decoder layers (the first is dense, the rest MoE).
    pub layers: usize,
    /// MTP rows written after the decoder layers.
    pub mtp_rows: usize,
    /// `num_nextn_predict_layers` in the config.
    pub nextn_layers: usize,
    /// `index_topk` (small values exercise the DSA selection).
    pub index_topk: usize,
    /// Tensors to leave out (to test the loader's errors).
    pub omit: Vec<String>,
    /// PRNG seed of the weights.
    pub seed: u64,
}

impl Default for TinyGlm {
    fn default() -> Self {
        Self {
            layers: 2,
            mtp_rows: 1,
            nextn_layers: 1,
            index_topk: 8,
            omit: Vec::new(),
            seed: 7,
        }
    }
}

const HIDDEN: i32 = 32;
const VOCAB: i32 = 96;
const HEADS: i32 = 2;
const LORA: i32 = 32;
const NOPE: i32 = 16;
const ROPE: i32 = 16;
const V_HEAD: i32 = 16;
const INDEX_HEADS: i32 = 2;
const INDEX_DIM: i32 = 32;
const INTER: i32 = 64;
const MOE_INTER: i32 = 32;
const EXPERTS: i32 = 4;

impl TinyGlm {
    /// The config this checkpoint declares.
    pub fn config(&self) -> serde_json::Value {
        serde_json::json!({
            "model_type": "glm_moe_dsa", "vocab_size": VOCAB, "hidden_size": HIDDEN,
            "index_head_dim": INDEX_DIM, "index_n_heads": INDEX_HEADS, "index_topk": self.index_topk,
            "intermediate_size": INTER, "moe_intermediate_size": MOE_INTER,
            "num_hidden_layers": self.layers, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
            "n_shared_experts": 1, "n_routed_experts": EXPERTS, "routed_scaling_factor": 2.5,
            "kv_lora_rank": LORA, "q_lora_rank": LORA, "qk_rope_head_dim": ROPE, "v_head_dim": V_HEAD,
            "qk_nope_head_dim": NOPE, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "norm_topk_prob": true, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
            "moe_layer_freq": 1, "first_k_dense_replace": 1, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "attention_bias": false, "num_nextn_predict_layers": self.nextn_layers, "eos_token_id": 2,
        })
    }

    fn shapes(&self) -> Vec<(String, Vec<i32>, bool)> {
        let mut t = vec![
            (
                "model.embed_tokens.weight".to_owned(),
                vec![VOCAB, HIDDEN],
                false,
            ),
            ("model.norm.weight".to_owned(), vec![HIDDEN], true),
            ("lm_head.weight".to_owned(), vec![VOCAB, HIDDEN], false),
        ];
        for i in 0..self.layers + self.mtp_rows {
            let p = format!("model.layers.{i}");
            let mut add = |n: &str, s: Vec<i32>, norm: bool| t.push((format!("{p}.{n}"), s, norm));
            add("input_layernorm.weight", vec![HIDDEN], true);
            add("post_attention_layernorm.weight", vec![HIDDEN], true);
            add("self_attn.q_a_proj.weight", vec![LORA, HIDDEN], false);
            add("self_attn.q_a_layernorm.weight", vec![LORA], true);
            add(
                "self_attn.q_b_proj.weight",
                vec![HEADS * (NOPE + ROPE), LORA],
                false,
            );
            add(
                "self_attn.kv_a_proj_with_mqa.weight",
                vec![LORA + ROPE, HIDDEN],
                false,
            );
            add("self_attn.kv_a_layernorm.weight", vec![LORA], true);
            add("self_attn.embed_q.weight", vec![HEADS, LORA, NOPE], false);
            add(
                "self_attn.unembed_out.weight",
                vec![HEADS, V_HEAD, LORA],
                false,
            );
            add(
                "self_attn.o_proj.weight",
                vec![HIDDEN, HEADS * V_HEAD],
                false,
            );
            add(
                "self_attn.indexer.wq_b.weight",
                vec![INDEX_HEADS * INDEX_DIM, LORA],
                false,
            );
            add(
                "self_attn.indexer.wk.weight",
                vec![INDEX_DIM, HIDDEN],
                false,
            );
            add("self_attn.indexer.k_norm.weight", vec![INDEX_DIM], true);
            add("self_attn.indexer.k_norm.bias", vec![INDEX_DIM], false);
            add(
                "self_attn.indexer.weights_proj.weight",
                vec![INDEX_HEADS, HIDDEN],
                false,
            );
            if i == 0 {
                add("mlp.gate_proj.weight", vec![INTER, HIDDEN], false);
                add("mlp.up_proj.weight", vec![INTER, HIDDEN], false);
                add("mlp.down_proj.weight", vec![HIDDEN, INTER], false);
            } else {
                add("mlp.gate.weight", vec![EXPERTS, HIDDEN], false);
                add("mlp.gate.e_score_correction_bias", vec![EXPERTS], false);
                add(
                    "mlp.switch_mlp.gate_proj.weight",
                    vec![EXPERTS, MOE_INTER, HIDDEN],
                    false,
                );
                add(
                    "mlp.switch_mlp.up_proj.weight",
                    vec![EXPERTS, MOE_INTER, HIDDEN],
                    false,
                );
                add(
                    "mlp.switch_mlp.down_proj.weight",
                    vec![EXPERTS, HIDDEN, MOE_INTER],
                    false,
                );
                add(
                    "mlp.shared_experts.gate_proj.weight",
                    vec![MOE_INTER, HIDDEN],
                    false,
                );
                add(
                    "mlp.shared_experts.up_proj.weight",
                    vec![MOE_INTER, HIDDEN],
                    false,
                );
                add(
                    "mlp.shared_experts.down_proj.weight",
                    vec![HIDDEN, MOE_INTER],
                    false,
                );
            }
            if i >= self.layers {
                add("enorm.weight", vec![HIDDEN], true);
                add("hnorm.weight", vec![HIDDEN], true);
                add("eh_proj.weight", vec![HIDDEN, 2 * HIDDEN], false);
                add("shared_head.norm.weight", vec![HIDDEN], true);
            }
        }
        t
    }

    /// Writes `config.json` and `model.safetensors` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), ModelError> {
        let io = |source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(dir.join("config.json"), self.config().to_string()).map_err(io)?;
        let mut tensors = HashMap::new();
        for (i, (name, shape, norm)) in self.shapes().into_iter().enumerate() {
            if self.omit.contains(&name) {
                continue;
            }
            let key =
                mlx_rs::random::key(self.seed.wrapping_mul(1_000_003).wrapping_add(i as u64))?;
            let std = if name.contains("embed_tokens") {
                0.5
            } else if norm {
                0.1
            } else {
                0.25
            };
            let loc = if norm { 1.0 } else { 0.0 };
            tensors.insert(
                name,
                mlx_rs::random::normal::<f32>(&shape[..], loc, std, &key)?,
            );
        }
        let path = dir.join("model.safetensors");
        Array::save_safetensors(&tensors, None, &path).map_err(|e| ModelError::WeightsFile {
            path,
            message: e.to_string(),
        })?;
        Ok(())
    }
}
