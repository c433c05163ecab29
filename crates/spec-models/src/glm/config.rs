//! `config.json` of `glm_moe_dsa` (GLM-5.x) as mlx-lm's `ModelArgs` reads
//! it, validated into `Config`.

use std::path::Path;

use serde::Deserialize;

use crate::config::Quantization;
use crate::rope::Rope;
use crate::ModelError;

fn default_true() -> bool {
    true
}

/// The keys mlx-lm's `glm_moe_dsa.ModelArgs` reads, plus the MTP count.
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
    quantization: Option<serde_json::Value>,
    quantization_config: Option<serde_json::Value>,
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
}

impl Config {
    /// Whether decoder layer `index` (MTP rows included) has an MoE MLP.
    pub fn is_moe_layer(&self, index: usize) -> bool {
        self.moe.is_some()
            && index >= self.first_k_dense_replace
            && index.is_multiple_of(self.moe_layer_freq)
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
    let moe = match c.n_routed_experts {
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
    let indexer = Rope::new(
        c.qk_rope_head_dim,
        theta as f32,
        c.indexer_rope_interleave,
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
    let quantization = Quantization::parse(
        c.quantization.as_ref().or(c.quantization_config.as_ref()),
        path,
    )?;
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
    };
    Ok((config, Ropes { attention, indexer }))
}
