//! The `glm_moe_dsa` (GLM-5.x) layout: the real config schema and mlx-lm's
//! tensor names (stacked `switch_mlp` experts, `embed_q` / `unembed_out`), a
//! dense first layer then MoE layers with experts in two groups, a DSA indexer,
//! and MTP rows at layer indices `num_hidden_layers..`, which mlx-lm drops and
//! our loader keeps.

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Init, TensorSpec, BIAS_STD, EMBED_STD, GATE_SEED, NORM_STD, WEIGHT_STD};

/// One GLM checkpoint. `Glm::default()` is the tiny test size.
#[derive(Debug, Clone, PartialEq)]
pub struct Glm {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// Decoder layers (the first `first_dense` dense, the rest MoE).
    pub layers: usize,
    /// MTP rows written after the decoder layers.
    pub mtp_rows: usize,
    /// `num_nextn_predict_layers` in the config.
    pub nextn_layers: usize,
    /// `index_topk` (small values exercise the DSA selection).
    pub index_topk: usize,
    /// Tensors to leave out (to test loaders' errors).
    pub omit: Vec<String>,
    /// `hidden_size`.
    pub hidden: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `num_attention_heads` (and `num_key_value_heads`).
    pub heads: usize,
    /// `q_lora_rank`.
    pub q_lora: usize,
    /// `kv_lora_rank`.
    pub kv_lora: usize,
    /// `qk_nope_head_dim`.
    pub qk_nope: usize,
    /// `qk_rope_head_dim`.
    pub qk_rope: usize,
    /// `v_head_dim`.
    pub v_head: usize,
    /// `index_n_heads`.
    pub index_heads: usize,
    /// `index_head_dim`.
    pub index_head_dim: usize,
    /// `intermediate_size` (dense MLPs).
    pub intermediate: usize,
    /// `moe_intermediate_size`.
    pub moe_intermediate: usize,
    /// `n_routed_experts`.
    pub experts: usize,
    /// `n_shared_experts`.
    pub shared_experts: usize,
    /// `first_k_dense_replace`.
    pub first_dense: usize,
    /// `max_position_embeddings`.
    pub max_positions: usize,
    /// Writes what a Hub checkpoint carries beyond what a loader needs:
    /// `architectures`, `tie_word_embeddings`, `hidden_act`, `torch_dtype`,
    /// the bos token id.
    pub hub_extras: bool,
}

impl Default for Glm {
    fn default() -> Self {
        Self {
            name: "glm",
            seed: 7,
            layers: 2,
            mtp_rows: 1,
            nextn_layers: 1,
            index_topk: 8,
            omit: Vec::new(),
            hidden: 32,
            vocab: 96,
            heads: 2,
            q_lora: 32,
            kv_lora: 32,
            qk_nope: 16,
            qk_rope: 16,
            v_head: 16,
            index_heads: 2,
            index_head_dim: 32,
            intermediate: 64,
            moe_intermediate: 32,
            experts: 4,
            shared_experts: 1,
            first_dense: 1,
            max_positions: 4096,
            hub_extras: false,
        }
    }
}

/// The gates' `index_topk`: below the longer gate prompts, above the shorter
/// ones, so prefill and decode run both dense and sparse.
pub const GATE_INDEX_TOPK: usize = 24;

impl Glm {
    /// The gates' `glm`: three decoder layers (one dense, two MoE), eight
    /// experts in two groups, one MTP row.
    pub fn gate() -> Self {
        Self {
            name: "glm",
            seed: GATE_SEED,
            layers: 3,
            mtp_rows: 1,
            nextn_layers: 1,
            index_topk: GATE_INDEX_TOPK,
            omit: Vec::new(),
            hidden: 64,
            vocab: 320,
            heads: 4,
            q_lora: 64,
            kv_lora: 64,
            qk_nope: 64,
            qk_rope: 32,
            v_head: 64,
            index_heads: 2,
            index_head_dim: 64,
            intermediate: 128,
            moe_intermediate: 64,
            experts: 8,
            shared_experts: 1,
            first_dense: 1,
            max_positions: 512,
            hub_extras: true,
        }
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        let mut c = json!({
            "model_type": "glm_moe_dsa",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "index_head_dim": self.index_head_dim,
            "index_n_heads": self.index_heads,
            "index_topk": self.index_topk,
            "intermediate_size": self.intermediate,
            "moe_intermediate_size": self.moe_intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "n_shared_experts": self.shared_experts,
            "n_routed_experts": self.experts,
            "routed_scaling_factor": 2.5,
            "kv_lora_rank": self.kv_lora,
            "q_lora_rank": self.q_lora,
            "qk_rope_head_dim": self.qk_rope,
            "v_head_dim": self.v_head,
            "qk_nope_head_dim": self.qk_nope,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": true,
            "n_group": 2,
            "topk_group": 1,
            "num_experts_per_tok": 2,
            "moe_layer_freq": 1,
            "first_k_dense_replace": self.first_dense,
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "attention_bias": false,
            "num_nextn_predict_layers": self.nextn_layers,
            "eos_token_id": 2,
        });
        if let (true, Some(map)) = (self.hub_extras, c.as_object_mut()) {
            map.insert("architectures".into(), json!(["GlmMoeDsaForCausalLM"]));
            map.insert("tie_word_embeddings".into(), json!(false));
            map.insert("hidden_act".into(), json!("silu"));
            map.insert("torch_dtype".into(), json!("float32"));
            map.insert("bos_token_id".into(), json!(1));
        }
        c
    }

    /// Every tensor, named as mlx-lm names them after `sanitize`, MTP rows
    /// included, `omit` left out.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (w, norm, bias) = (
            Init::Normal(WEIGHT_STD),
            Init::OnePlusNormal(NORM_STD),
            Init::Normal(BIAS_STD),
        );
        let (h, heads, experts) = (self.hidden, self.heads, self.experts);
        let (q_lora, kv_lora, rope) = (self.q_lora, self.kv_lora, self.qk_rope);
        let (ih, id) = (self.index_heads, self.index_head_dim);
        let (inter, moe) = (self.intermediate, self.moe_intermediate);
        let mut t = vec![
            TensorSpec::new(
                "model.embed_tokens.weight",
                vec![self.vocab, h],
                Init::Normal(EMBED_STD),
            ),
            TensorSpec::new("model.norm.weight", vec![h], norm),
            TensorSpec::new("lm_head.weight", vec![self.vocab, h], w),
        ];
        for i in 0..self.layers + self.mtp_rows {
            let p = format!("model.layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{p}.{name}"), shape, init))
            };
            add("input_layernorm.weight", vec![h], norm);
            add("post_attention_layernorm.weight", vec![h], norm);
            add("self_attn.q_a_proj.weight", vec![q_lora, h], w);
            add("self_attn.q_a_layernorm.weight", vec![q_lora], norm);
            let q_head = self.qk_nope + rope;
            add("self_attn.q_b_proj.weight", vec![heads * q_head, q_lora], w);
            add(
                "self_attn.kv_a_proj_with_mqa.weight",
                vec![kv_lora + rope, h],
                w,
            );
            add("self_attn.kv_a_layernorm.weight", vec![kv_lora], norm);
            add(
                "self_attn.embed_q.weight",
                vec![heads, kv_lora, self.qk_nope],
                w,
            );
            add(
                "self_attn.unembed_out.weight",
                vec![heads, self.v_head, kv_lora],
                w,
            );
            add("self_attn.o_proj.weight", vec![h, heads * self.v_head], w);
            add("self_attn.indexer.wq_b.weight", vec![ih * id, q_lora], w);
            add("self_attn.indexer.wk.weight", vec![id, h], w);
            add("self_attn.indexer.k_norm.weight", vec![id], norm);
            add("self_attn.indexer.k_norm.bias", vec![id], bias);
            add("self_attn.indexer.weights_proj.weight", vec![ih, h], w);
            if i < self.first_dense {
                add("mlp.gate_proj.weight", vec![inter, h], w);
                add("mlp.up_proj.weight", vec![inter, h], w);
                add("mlp.down_proj.weight", vec![h, inter], w);
            } else {
                add("mlp.gate.weight", vec![experts, h], w);
                add("mlp.gate.e_score_correction_bias", vec![experts], bias);
                add("mlp.switch_mlp.gate_proj.weight", vec![experts, moe, h], w);
                add("mlp.switch_mlp.up_proj.weight", vec![experts, moe, h], w);
                add("mlp.switch_mlp.down_proj.weight", vec![experts, h, moe], w);
                let shared = moe * self.shared_experts;
                add("mlp.shared_experts.gate_proj.weight", vec![shared, h], w);
                add("mlp.shared_experts.up_proj.weight", vec![shared, h], w);
                add("mlp.shared_experts.down_proj.weight", vec![h, shared], w);
            }
            if i >= self.layers {
                add("enorm.weight", vec![h], norm);
                add("hnorm.weight", vec![h], norm);
                add("eh_proj.weight", vec![h, 2 * h], w);
                add("shared_head.norm.weight", vec![h], norm);
            }
        }
        t.retain(|s| !self.omit.contains(&s.name));
        t
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if
    /// missing).
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        crate::write_checkpoint(dir, &self.config(), &self.tensors(), self.seed, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes re-derived from the config alone, as mlx-lm's `deepseek_v32`
    /// builds its modules (plus the MTP row it drops).
    #[test]
    fn tensor_shapes_follow_the_config() {
        for spec in [Glm::gate(), Glm::default()] {
            let c = spec.config();
            let get = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
            let t = spec.tensors();
            let find = |name: &str| {
                t.iter()
                    .find(|s| s.name == name)
                    .map(|s| s.shape.clone())
                    .unwrap_or_else(|| panic!("{name}"))
            };
            let heads = get("num_attention_heads");
            assert_eq!(
                find("model.layers.0.self_attn.q_b_proj.weight"),
                [
                    heads * (get("qk_nope_head_dim") + get("qk_rope_head_dim")),
                    get("q_lora_rank")
                ]
            );
            assert_eq!(
                find("model.layers.1.self_attn.embed_q.weight"),
                [heads, get("kv_lora_rank"), get("qk_nope_head_dim")]
            );
            assert_eq!(
                find("model.layers.1.mlp.switch_mlp.down_proj.weight"),
                [
                    get("n_routed_experts"),
                    get("hidden_size"),
                    get("moe_intermediate_size")
                ]
            );
            let mtp = get("num_hidden_layers");
            assert_eq!(
                find(&format!("model.layers.{mtp}.eh_proj.weight")),
                [get("hidden_size"), 2 * get("hidden_size")]
            );
            assert!(
                t.iter()
                    .all(|s| !s.name.contains("layers.0.mlp.switch_mlp")),
                "first_k_dense_replace layers are dense"
            );
            let mut names: Vec<&str> = t.iter().map(|s| s.name.as_str()).collect();
            names.sort_unstable();
            let before = names.len();
            names.dedup();
            assert_eq!(before, names.len(), "no tensor twice");
        }
    }

    #[test]
    fn omitted_tensors_are_left_out() {
        let name = "model.layers.1.mlp.gate.weight".to_owned();
        let spec = Glm {
            omit: vec![name.clone()],
            ..Glm::default()
        };
        assert!(!spec.tensors().iter().any(|s| s.name == name));
        assert_eq!(spec.tensors().len() + 1, Glm::default().tensors().len());
    }
}
