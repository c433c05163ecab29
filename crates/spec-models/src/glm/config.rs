//! `config.json` of `glm_moe_dsa` (GLM-5.x) as mlx-lm's `ModelArgs` reads
//! it, validated into `Config`.

use std::path::Path;

use serde::Deserialize;

use super::schedule::{self, IndexerKeys, IndexerType};
use crate::config::{Quantization, QuantizationKeys};
use crate::rope::Rope;
use crate::ModelError;

/// `nn.LayerNorm`'s default epsilon: mlx-lm's indexer key norm.
const MLX_LM_INDEXER_NORM_EPS: f32 = 1e-5;
/// The indexer key norm's epsilon in transformers' `GlmMoeDsaIndexer`.
const REFERENCE_INDEXER_NORM_EPS: f32 = 1e-6;

fn default_true() -> bool {
    true
}

/// The keys mlx-lm's `glm_moe_dsa.ModelArgs` reads, plus the MTP count and
/// GLM-5.2's keys (transformers' `GlmMoeDsaConfig`).
#[derive(Debug, Deserialize)]
pub(super) struct ConfigFile {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    index_head_dim: i32,
    index_n_heads: i32,
    index_topk: usize,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    n_shared_experts: Option<i32>,
    n_routed_experts: Option<i32>,
    routed_scaling_factor: f64,
    kv_lora_rank: i32,
    q_lora_rank: i32,
    qk_rope_head_dim: i32,
    v_head_dim: i32,
    qk_nope_head_dim: i32,
    topk_method: String,
    scoring_func: String,
    norm_topk_prob: bool,
    n_group: i32,
    topk_group: i32,
    num_experts_per_tok: i32,
    moe_layer_freq: usize,
    first_k_dense_replace: usize,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_parameters: serde_json::Value,
    attention_bias: bool,
    #[serde(default = "default_true")]
    indexer_rope_interleave: bool,
    /// MTP rows after the decoder layers (GLM-5.x ships one).
    #[serde(default)]
    num_nextn_predict_layers: usize,
    // mlx-lm writes the block under both names; `quantization` wins.
    #[serde(flatten)]
    quantization: QuantizationKeys,
    // GLM-5.2 (IndexShare and transformers' per-layer lists).
    indexer_types: Option<Vec<String>>,
    index_topk_pattern: Option<serde_json::Value>,
    index_topk_freq: Option<i64>,
    index_skip_topk_offset: Option<i64>,
    index_share_for_mtp_iteration: Option<bool>,
    mlp_layer_types: Option<Vec<String>>,
    layer_types: Option<Vec<String>>,
    /// transformers' backward-compatible alias of `n_routed_experts`.
    num_experts: Option<i32>,
    /// Read for validation only: transformers overrides it with
    /// `qk_rope_head_dim` (GLM-5.2 publishes 192, neither that nor
    /// `qk_nope_head_dim + qk_rope_head_dim`).
    head_dim: Option<i32>,
    /// Read for validation only: the generate path takes its EOS ids from
    /// the tokenizer files and this key (`spec_text`).
    eos_token_id: Option<serde_json::Value>,
}

/// The routed-expert part of the configuration.
#[derive(Debug, Clone)]
pub struct MoeConfig {
    /// Routed experts.
    pub experts: i32,
    /// Experts per token.
    pub top_k: i32,
    /// Expert groups (group-limited routing when > 1).
    pub n_group: i32,
    /// Groups each token may route to.
    pub topk_group: i32,
    /// Multiplier of the routing weights.
    pub routed_scaling: f32,
    /// Renormalise the top-k weights to sum to one.
    pub norm_topk_prob: bool,
    /// Width of one expert's MLP.
    pub intermediate: i32,
    /// Shared experts (their MLP is `shared * intermediate` wide).
    pub shared: Option<i32>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Checkpoint architecture (`glm_moe_dsa`).
    pub model_type: String,
    /// Hidden width.
    pub hidden: i32,
    /// Decoder layers (the MTP rows come after them).
    pub layers: usize,
    /// Vocabulary size.
    pub vocab: i32,
    /// Dense MLP width.
    pub intermediate: i32,
    /// Attention heads.
    pub heads: i32,
    /// Query low-rank width.
    pub q_lora_rank: i32,
    /// Compressed key/value latent width.
    pub kv_lora_rank: i32,
    /// Non-rotary part of a query/key head.
    pub qk_nope: i32,
    /// Rotary part of a query/key head.
    pub qk_rope: i32,
    /// Value head width.
    pub v_head: i32,
    /// Softmax scale of the attention.
    pub scale: f32,
    /// Biases on the attention projections.
    pub attention_bias: bool,
    /// Indexer heads.
    pub index_heads: i32,
    /// Indexer head width.
    pub index_head_dim: i32,
    /// Keys the DSA indexer keeps per query (dense below this context).
    pub index_topk: usize,
    /// Routed experts, when the checkpoint has them.
    pub moe: Option<MoeConfig>,
    /// Leading layers with a dense MLP.
    pub first_k_dense_replace: usize,
    /// Every `moe_layer_freq`-th layer (after those) is MoE.
    pub moe_layer_freq: usize,
    /// RMS norm epsilon of the blocks.
    pub eps: f32,
    /// MTP rows the config declares (`num_nextn_predict_layers`).
    pub nextn_layers: usize,
    /// Quantization block.
    pub quantization: Quantization,
    /// `max_position_embeddings`.
    pub context_length: usize,
    /// Per decoder layer: its own indexer or the previous full layer's top-k
    /// (every layer full without GLM-5.2's keys).
    pub indexer_types: Vec<IndexerType>,
    /// `index_share_for_mtp_iteration`: MTP draft steps after the first of
    /// a round reuse the first step's selection.
    pub index_share_for_mtp: bool,
    /// Epsilon of the indexer's key LayerNorm: transformers' 1e-6 for
    /// GLM-5.2-schema configs (any IndexShare key), mlx-lm's 1e-5 otherwise.
    pub indexer_norm_eps: f32,
    /// `mlp_layer_types` as `true` = sparse, when the config has it (it then
    /// decides dense/sparse for the decoder layers, as in transformers).
    pub mlp_sparse: Option<Vec<bool>>,
}

impl Config {
    /// Whether decoder layer `index` (MTP rows included) has an MoE MLP:
    /// `mlp_layer_types` where it covers the layer, else mlx-lm's rule
    /// (`first_k_dense_replace`, `moe_layer_freq`; the MTP rows always).
    pub fn is_moe_layer(&self, index: usize) -> bool {
        if self.moe.is_none() {
            return false;
        }
        match self.mlp_sparse.as_ref().and_then(|s| s.get(index)) {
            Some(sparse) => *sparse,
            None => {
                index >= self.first_k_dense_replace && index.is_multiple_of(self.moe_layer_freq)
            }
        }
    }

    /// Whether decoder layer `index` runs its own indexer.
    pub fn has_indexer(&self, index: usize) -> bool {
        self.indexer_types.get(index) == Some(&IndexerType::Full)
    }
}

/// The attention's and the indexer's RoPE.
#[derive(Debug)]
pub(super) struct Ropes {
    pub attention: Rope,
    pub indexer: Rope,
}

pub(super) fn parse(c: ConfigFile, path: &Path) -> Result<(Config, Ropes), ModelError> {
    let bad = |message: String| ModelError::Config {
        path: path.to_path_buf(),
        message,
    };
    if c.topk_method != "noaux_tc" {
        return Err(bad(format!(
            "topk_method `{}` is not supported (noaux_tc is)",
            c.topk_method
        )));
    }
    if c.scoring_func != "sigmoid" {
        return Err(bad(format!(
            "scoring_func `{}` is not supported (sigmoid is)",
            c.scoring_func
        )));
    }
    for (name, v) in [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("index_head_dim", c.index_head_dim),
        ("index_n_heads", c.index_n_heads),
        ("intermediate_size", c.intermediate_size),
        ("moe_intermediate_size", c.moe_intermediate_size),
        ("num_attention_heads", c.num_attention_heads),
        ("kv_lora_rank", c.kv_lora_rank),
        ("q_lora_rank", c.q_lora_rank),
        ("qk_rope_head_dim", c.qk_rope_head_dim),
        ("v_head_dim", c.v_head_dim),
        ("qk_nope_head_dim", c.qk_nope_head_dim),
        ("num_experts_per_tok", c.num_experts_per_tok),
        ("n_group", c.n_group),
        ("topk_group", c.topk_group),
    ] {
        if v <= 0 {
            return Err(bad(format!("{name} must be positive, got {v}")));
        }
    }
    if c.num_hidden_layers == 0 || c.moe_layer_freq == 0 || c.index_topk == 0 {
        return Err(bad(
            "num_hidden_layers, moe_layer_freq and index_topk must be positive".into(),
        ));
    }
    if c.qk_rope_head_dim > c.index_head_dim || c.qk_rope_head_dim % 2 != 0 {
        return Err(bad(format!(
            "qk_rope_head_dim {} must be even and fit the indexer head ({})",
            c.qk_rope_head_dim, c.index_head_dim
        )));
    }
    let n_routed_experts = match (c.n_routed_experts, c.num_experts) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad(format!(
                "n_routed_experts {a} and num_experts {b} disagree (num_experts is its alias)"
            )))
        }
        (a, b) => a.or(b),
    };
    let indexer_keys = IndexerKeys {
        indexer_types: c.indexer_types.as_deref(),
        pattern: c.index_topk_pattern.as_ref().filter(|v| !v.is_null()),
        freq: c.index_topk_freq,
        offset: c.index_skip_topk_offset,
    };
    let glm52_schema = indexer_keys.any() || c.index_share_for_mtp_iteration.is_some();
    let indexer_types =
        schedule::indexer_schedule(&indexer_keys, c.num_hidden_layers).map_err(bad)?;
    let mlp_sparse = c
        .mlp_layer_types
        .as_deref()
        .map(|t| schedule::mlp_schedule(t, c.num_hidden_layers, n_routed_experts.is_some()))
        .transpose()
        .map_err(bad)?;
    if let Some(sparse) = &mlp_sparse {
        let rule = |i: usize| {
            n_routed_experts.is_some()
                && i >= c.first_k_dense_replace
                && i.is_multiple_of(c.moe_layer_freq)
        };
        if let Some(i) = (0..sparse.len()).find(|&i| sparse[i] != rule(i)) {
            tracing::warn!(
                layer = i,
                "mlp_layer_types disagrees with first_k_dense_replace / moe_layer_freq; \
                 mlp_layer_types decides, as in transformers"
            );
        }
    }
    if let Some(types) = &c.layer_types {
        schedule::check_layer_types(types, c.num_hidden_layers).map_err(bad)?;
    }
    if let Some(d) = c.head_dim.filter(|d| *d <= 0) {
        return Err(bad(format!("head_dim must be positive, got {d}")));
    }
    if let Some(eos) = &c.eos_token_id {
        let id = |v: &serde_json::Value| v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX));
        let ok = match eos {
            serde_json::Value::Array(ids) => ids.iter().all(id),
            other => other.is_null() || id(other),
        };
        if !ok {
            return Err(bad(format!(
                "eos_token_id must be a token id or a list of them, got {eos}"
            )));
        }
    }
    let moe = match n_routed_experts {
        None => None,
        Some(experts) => {
            let (k, g, tg) = (c.num_experts_per_tok, c.n_group, c.topk_group);
            if experts <= 0 || k > experts {
                return Err(bad(format!(
                    "num_experts_per_tok {k} must be within n_routed_experts {experts}"
                )));
            }
            if experts % g != 0 || tg > g {
                return Err(bad(format!("n_routed_experts {experts} must split into n_group {g} groups, topk_group {tg} <= n_group")));
            }
            if g > 1 && experts / g < 2 {
                return Err(bad(format!(
                    "group-limited routing scores groups by their top 2 experts: {} per group",
                    experts / g
                )));
            }
            if let Some(s) = c.n_shared_experts.filter(|s| *s <= 0) {
                return Err(bad(format!("n_shared_experts must be positive, got {s}")));
            }
            Some(MoeConfig {
                experts,
                top_k: k,
                n_group: g,
                topk_group: tg,
                routed_scaling: c.routed_scaling_factor as f32,
                norm_topk_prob: c.norm_topk_prob,
                intermediate: c.moe_intermediate_size,
                shared: c.n_shared_experts,
            })
        }
    };
    let params = &c.rope_parameters;
    let theta = params
        .get("rope_theta")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| bad("rope_parameters.rope_theta is missing".into()))?;
    let attention = Rope::new(c.qk_rope_head_dim, theta as f32, true, Some(params), path)?;
    // The indexer rotates the first `qk_rope_head_dim` dims of its head
    // (the rest pass through), in interleaved pairs `(x0, x1), (x2, x3)`:
    // mlx-lm (`traditional = indexer_rope_interleave`) and transformers'
    // GLM-5.2 indexer agree on this (transformers writes the rotated pairs
    // back de-interleaved, the same permutation on queries and keys, so
    // every score is the same dot product). transformers always
    // interleaves; GLM-5.2-schema configs follow it.
    let interleave = c.indexer_rope_interleave || glm52_schema;
    if glm52_schema && !c.indexer_rope_interleave {
        tracing::warn!(
            "indexer_rope_interleave false ignored: GLM-5.2's indexer rotates interleaved pairs (transformers)"
        );
    }
    let indexer = Rope::new(
        c.qk_rope_head_dim,
        theta as f32,
        interleave,
        Some(params),
        path,
    )?;
    // As mlx-lm: the softmax scale in double precision, with YaRN's mscale
    // when the RoPE parameters ask for it.
    let mut scale = f64::from(c.qk_nope_head_dim + c.qk_rope_head_dim).powf(-0.5);
    let mscale_all_dim = params
        .get("mscale_all_dim")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(0.0);
    if mscale_all_dim != 0.0 {
        let factor = params
            .get("factor")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(1.0);
        if factor > 1.0 {
            let s = 0.1 * mscale_all_dim * factor.ln() + 1.0;
            scale = scale * s * s;
        }
    }
    let quantization = c.quantization.parse(path)?;
    let config = Config {
        model_type: c.model_type,
        hidden: c.hidden_size,
        layers: c.num_hidden_layers,
        vocab: c.vocab_size,
        intermediate: c.intermediate_size,
        heads: c.num_attention_heads,
        q_lora_rank: c.q_lora_rank,
        kv_lora_rank: c.kv_lora_rank,
        qk_nope: c.qk_nope_head_dim,
        qk_rope: c.qk_rope_head_dim,
        v_head: c.v_head_dim,
        scale: scale as f32,
        attention_bias: c.attention_bias,
        index_heads: c.index_n_heads,
        index_head_dim: c.index_head_dim,
        index_topk: c.index_topk,
        moe,
        first_k_dense_replace: c.first_k_dense_replace,
        moe_layer_freq: c.moe_layer_freq,
        eps: c.rms_norm_eps as f32,
        nextn_layers: c.num_nextn_predict_layers,
        quantization,
        context_length: c.max_position_embeddings,
        indexer_types,
        index_share_for_mtp: c.index_share_for_mtp_iteration.unwrap_or(false),
        indexer_norm_eps: if glm52_schema {
            REFERENCE_INDEXER_NORM_EPS
        } else {
            MLX_LM_INDEXER_NORM_EPS
        },
        mlp_sparse,
    };
    Ok((config, Ropes { attention, indexer }))
}
