//! The `glm_moe_dsa` (GLM-5.x) layout: the real config schema and mlx-lm's
//! tensor names (stacked `switch_mlp` experts, `embed_q` / `unembed_out`), a
//! dense first layer then MoE layers with experts in two groups, a DSA indexer,
//! and MTP rows at layer indices `num_hidden_layers..`, which mlx-lm drops and
//! our loader keeps. With `index_share` it is GLM-5.2's schema instead: the
//! released config's key set (IndexShare's `indexer_types`, `mlp_layer_types`,
//! `num_experts`, `layer_types`, `head_dim`, three EOS ids, ...), indexer
//! tensors only on the full layers and on the MTP row.

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
    /// GLM-5.2's schema and IndexShare; `None` is GLM-5's (an indexer on
    /// every layer, mlx-lm's keys).
    pub index_share: Option<IndexShare>,
}

/// GLM-5.2's IndexShare layout of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexShare {
    /// Per decoder layer: `F` runs its own indexer (and has its tensors),
    /// `S` reuses the previous full layer's top-k. Written as `indexer_types`.
    pub pattern: &'static str,
    /// `index_share_for_mtp_iteration`.
    pub share_for_mtp: bool,
    /// Whether the MTP rows carry `self_attn.indexer.*`.
    pub mtp_indexer: bool,
}

impl IndexShare {
    /// Whether decoder layer `i` runs its own indexer.
    pub fn is_full(&self, i: usize) -> bool {
        self.pattern.as_bytes().get(i) == Some(&b'F')
    }
}

/// GLM-5.2's end-of-sequence ids (`eos_token_id` of the release).
pub const GLM52_EOS: [u32; 3] = [154_820, 154_827, 154_829];

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
            index_share: None,
        }
    }
}

/// The gates' `index_topk`: below the longer gate prompts, above the shorter
/// ones, so prefill and decode run both dense and sparse.
pub const GATE_INDEX_TOPK: usize = 24;

/// The `glm52` gate model's `index_topk`: below every gate prompt.
pub const GLM52_GATE_INDEX_TOPK: usize = 6;

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
            index_share: None,
        }
    }

    /// The gates' `glm52`: GLM-5.2's schema at gate widths, five decoder
    /// layers (`FFSFS`: full and shared layers mixed, a shared layer after
    /// each of two full ones), `index_topk` 6 so that every gate prompt runs
    /// sparse, `index_share_for_mtp_iteration` on, the MTP row with its
    /// indexer.
    pub fn glm52_gate() -> Self {
        Self {
            name: "glm52",
            layers: 5,
            index_topk: GLM52_GATE_INDEX_TOPK,
            index_share: Some(IndexShare {
                pattern: "FFSFS",
                share_for_mtp: true,
                mtp_indexer: true,
            }),
            ..Self::gate()
        }
    }

    /// The tiny test size in GLM-5.2's schema (`FFSFS`, `index_topk` 4, the
    /// MTP row with its indexer and `index_share_for_mtp_iteration` on).
    pub fn glm52_tiny() -> Self {
        Self {
            name: "glm52",
            layers: 5,
            index_topk: 4,
            index_share: Some(IndexShare {
                pattern: "FFSFS",
                share_for_mtp: true,
                mtp_indexer: true,
            }),
            ..Self::default()
        }
    }

    /// Whether layer `i` (MTP rows included) carries indexer tensors.
    fn has_indexer(&self, i: usize) -> bool {
        match &self.index_share {
            None => true,
            Some(share) if i >= self.layers => share.mtp_indexer,
            Some(share) => share.is_full(i),
        }
    }

    /// GLM-5.2's keys beyond GLM-5's, as the released `config.json` has
    /// them (transformers' `GlmMoeDsaConfig`).
    fn glm52_keys(&self, share: &IndexShare) -> Value {
        let types: Vec<&str> = (0..self.layers)
            .map(|i| if share.is_full(i) { "full" } else { "shared" })
            .collect();
        let mlp: Vec<&str> = (0..self.layers)
            .map(|i| {
                if i < self.first_dense {
                    "dense"
                } else {
                    "sparse"
                }
            })
            .collect();
        json!({
            "architectures": ["GlmMoeDsaForCausalLM"],
            "indexer_types": types,
            "index_topk_freq": 2,
            "index_skip_topk_offset": 2,
            "index_topk_pattern": null,
            "index_share_for_mtp_iteration": share.share_for_mtp,
            "indexer_rope_interleave": true,
            "rope_interleave": true,
            "mlp_layer_types": mlp,
            "layer_types": vec!["deepseek_sparse_attention"; self.layers],
            "num_experts": self.experts,
            "head_dim": self.qk_nope,
            "qk_head_dim": self.qk_nope + self.qk_rope,
            "eos_token_id": GLM52_EOS,
            "pad_token_id": GLM52_EOS[0],
            "bos_token_id": 0,
            "tie_word_embeddings": false,
            "hidden_act": "silu",
            "mlp_bias": false,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": true,
            "moe_router_dtype": "float32",
            "dtype": "float32",
        })
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
        if let (Some(share), Some(map)) = (&self.index_share, c.as_object_mut()) {
            if let Value::Object(extra) = self.glm52_keys(share) {
                map.extend(extra);
            }
            map.insert(
                "rope_parameters".into(),
                json!({"rope_theta": 8_000_000.0, "rope_type": "default"}),
            );
        }
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
            if self.has_indexer(i) {
                add("self_attn.indexer.wq_b.weight", vec![ih * id, q_lora], w);
                add("self_attn.indexer.wk.weight", vec![id, h], w);
                add("self_attn.indexer.k_norm.weight", vec![id], norm);
                add("self_attn.indexer.k_norm.bias", vec![id], bias);
                add("self_attn.indexer.weights_proj.weight", vec![ih, h], w);
            }
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
        for spec in [
            Glm::gate(),
            Glm::default(),
            Glm::glm52_gate(),
            Glm::glm52_tiny(),
        ] {
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
    fn index_share_writes_indexers_on_full_layers_and_the_mtp_row_only() {
        let spec = Glm::glm52_tiny();
        let names: Vec<String> = spec.tensors().into_iter().map(|s| s.name).collect();
        let has =
            |i: usize| names.contains(&format!("model.layers.{i}.self_attn.indexer.wq_b.weight"));
        assert_eq!(
            (0..6).map(has).collect::<Vec<_>>(),
            [true, true, false, true, false, true]
        );
        let c = spec.config();
        assert_eq!(c["indexer_types"][2], "shared");
        assert_eq!(c["eos_token_id"].as_array().map(Vec::len), Some(3));
        assert_eq!(c["num_experts"], c["n_routed_experts"]);
        assert_eq!(
            Glm::default().config().get("indexer_types"),
            None,
            "GLM-5's schema"
        );
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
