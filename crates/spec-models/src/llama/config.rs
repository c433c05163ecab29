//! The llama family's `config.json`: the keys each `model_type` reads,
//! their defaults (mlx-lm 0.32.2's `llama.py`, `qwen2.py`, `qwen3.py`,
//! `qwen3_moe.py`, `gpt_oss.py`), and the checks that name a bad key.

use std::path::Path;

use serde::Deserialize;

use crate::config::{Quantization, QuantizationKeys};
use crate::rope::Rope;
use crate::sparse_moe::{MoeConfig, MoeFlavor, MoeKeys};
use crate::ModelError;

/// `config.json` keys the llama family reads.
#[derive(Debug, Deserialize)]
pub(super) struct ConfigFile {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: usize,
    intermediate_size: i32,
    num_attention_heads: i32,
    rms_norm_eps: f32,
    vocab_size: i32,
    head_dim: Option<i32>,
    num_key_value_heads: Option<i32>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    rope_theta: Option<f32>,
    #[serde(default)]
    rope_traditional: bool,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    layer_types: Option<Vec<String>>,
    sliding_window: Option<usize>,
    hidden_act: Option<String>,
    // `qwen3_moe`'s expert blocks.
    #[serde(default)]
    num_experts: usize,
    #[serde(default)]
    num_experts_per_tok: i32,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    #[serde(default)]
    moe_intermediate_size: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    // gpt-oss's expert blocks (every layer).
    num_local_experts: Option<usize>,
    // mlx-lm writes the block under both names; `quantization` wins.
    #[serde(flatten)]
    quantization: QuantizationKeys,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Checkpoint architecture.
    pub model_type: String,
    /// Hidden width.
    pub hidden: i32,
    /// Decoder layers.
    pub layers: usize,
    /// MLP width.
    pub intermediate: i32,
    /// Query heads.
    pub heads: i32,
    /// Key/value heads.
    pub kv_heads: i32,
    /// Per-head width.
    pub head_dim: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Vocabulary size.
    pub vocab: i32,
    /// Biases on q/k/v.
    pub qkv_bias: bool,
    /// Bias on o_proj.
    pub o_bias: bool,
    /// Biases in the MLP.
    pub mlp_bias: bool,
    /// Per-head RMS norms on queries and keys (qwen3).
    pub qk_norm: bool,
    /// Output head shares the embedding table.
    pub tied: bool,
    /// Per-layer sliding windows (`None` = full attention).
    pub windows: Vec<Option<usize>>,
    /// Quantization block.
    pub quantization: Quantization,
    /// `max_position_embeddings`, when given.
    pub context_length: Option<usize>,
    /// The expert blocks' sizes (`qwen3_moe` with experts; `None`: every
    /// layer dense).
    pub moe: Option<MoeConfig>,
    /// Per layer: an expert block (else the dense MLP).
    pub sparse: Vec<bool>,
    /// Per-head attention sinks in every layer (`gpt_oss`).
    pub sinks: bool,
    /// The score scale.
    pub scale: f32,
}

fn one() -> usize {
    1
}

/// Checks the file into a [`Config`] and its RoPE; `path` names it in
/// errors.
pub(super) fn parse(c: ConfigFile, path: &Path) -> Result<(Config, Rope), ModelError> {
    let path = path.to_path_buf();
    let bad = |message: String| ModelError::Config {
        path: path.clone(),
        message,
    };
    let arch = c.model_type.as_str();
    // `qwen3_moe` is `qwen3`'s attention with expert blocks.
    let qwen3 = arch == "qwen3" || arch == "qwen3_moe";
    let gpt_oss = arch == "gpt_oss";
    if let Some(act) = c.hidden_act.as_deref() {
        if act != "silu" {
            return Err(bad(format!(
                "hidden_act `{act}` is not supported by {arch} (silu is)"
            )));
        }
    }
    for (name, v) in [
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_attention_heads", c.num_attention_heads),
        ("vocab_size", c.vocab_size),
    ] {
        if v <= 0 {
            return Err(bad(format!("{name} must be positive, got {v}")));
        }
    }
    if c.num_hidden_layers == 0 {
        return Err(bad("num_hidden_layers must be positive".into()));
    }
    let kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
    if kv_heads <= 0 || c.num_attention_heads % kv_heads != 0 {
        return Err(bad(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {kv_heads}",
            c.num_attention_heads
        )));
    }
    let head_dim = match c.head_dim {
        Some(d) if d > 0 => d,
        Some(d) => return Err(bad(format!("head_dim must be positive, got {d}"))),
        None if qwen3 || gpt_oss => return Err(bad(format!("{arch} configs must give head_dim"))),
        None if c.hidden_size % c.num_attention_heads != 0 => {
            return Err(bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                c.hidden_size, c.num_attention_heads
            )))
        }
        None => c.hidden_size / c.num_attention_heads,
    };
    let rope_theta = c.rope_theta.or_else(|| {
        c.rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .map(|t| t as f32)
    });
    let rope_theta = match (arch, rope_theta) {
        (_, Some(t)) => t,
        ("qwen2", None) => 1_000_000.0,
        ("gpt_oss", None) => 150_000.0,
        (_, None) if qwen3 => return Err(bad("rope_theta is missing".into())),
        (_, None) => 10_000.0,
    };
    // mlx-lm's `qwen3_moe` builds a plain RoPE of `rope_theta`, whatever
    // scaling the file names.
    let scaling = c.rope_scaling.as_ref().or(c.rope_parameters.as_ref());
    let (scaling, traditional) = match arch {
        "qwen3_moe" => (None, false),
        _ => (scaling, c.rope_traditional),
    };
    let rope = Rope::new(head_dim, rope_theta, traditional, scaling, &path)?;
    let tied = match (arch, c.tie_word_embeddings) {
        // mlx-lm's gpt-oss always has its own head.
        ("gpt_oss", _) => false,
        (_, Some(t)) => t,
        (_, None) if qwen3 => {
            return Err(bad(format!("{arch} configs must give tie_word_embeddings")))
        }
        (_, None) => true,
    };
    // gpt-oss's default: sliding and full layers in turn, a window of 128.
    let alternating: Vec<String> = (0..c.num_hidden_layers)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
            .to_owned()
        })
        .collect();
    let layer_types = match (&c.layer_types, gpt_oss) {
        (None, true) => Some(&alternating),
        (types, _) => types.as_ref(),
    };
    let sliding_window = c.sliding_window.or(gpt_oss.then_some(128));
    let windows = match layer_types {
        None => vec![None; c.num_hidden_layers],
        Some(types) if types.len() != c.num_hidden_layers => {
            return Err(bad(format!(
                "layer_types has {} entries for {} layers",
                types.len(),
                c.num_hidden_layers
            )))
        }
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(None),
                "sliding_attention" => sliding_window
                    .filter(|w| *w > 0)
                    .map(Some)
                    .ok_or_else(|| bad("sliding_attention layers need sliding_window".into())),
                other => Err(bad(format!("layer type `{other}` is not supported"))),
            })
            .collect::<Result<_, _>>()?,
    };
    if !matches!(arch, "llama" | "mistral" | "gpt_oss") && windows.iter().any(Option::is_some) {
        return Err(bad(format!("{arch}: sliding layers are not supported")));
    }
    let (qkv_bias, o_bias) = match arch {
        "qwen2" => (true, false),
        _ if qwen3 => (false, false),
        // mlx-lm's gpt-oss: biases on all four, whatever the key says.
        "gpt_oss" => (true, true),
        _ => (c.attention_bias, c.attention_bias),
    };
    let quantization = c.quantization.parse(&path)?;
    let (moe, sparse) = if gpt_oss {
        let experts = c.num_local_experts.unwrap_or(0);
        let experts = i32::try_from(experts)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| bad(format!("num_local_experts must be positive, got {experts}")))?;
        if !(1..=experts).contains(&c.num_experts_per_tok) {
            return Err(bad(format!(
                "num_experts_per_tok must lie in 1..={experts} (num_local_experts), got {}",
                c.num_experts_per_tok
            )));
        }
        let moe = MoeConfig {
            experts,
            top_k: c.num_experts_per_tok,
            intermediate: c.intermediate_size,
            shared_intermediate: None,
            norm_topk_prob: false,
            flavor: MoeFlavor::GptOss,
        };
        (Some(moe), vec![true; c.num_hidden_layers])
    } else if arch == "qwen3_moe" {
        let keys = MoeKeys {
            num_experts: c.num_experts,
            num_experts_per_tok: c.num_experts_per_tok,
            decoder_sparse_step: c.decoder_sparse_step,
            mlp_only_layers: &c.mlp_only_layers,
            moe_intermediate_size: c.moe_intermediate_size,
            shared_expert_intermediate_size: None,
            norm_topk_prob: c.norm_topk_prob,
        };
        let sparse = keys.sparse_layers(c.num_hidden_layers).map_err(&bad)?;
        (keys.config(&sparse).map_err(&bad)?, sparse)
    } else {
        (None, vec![false; c.num_hidden_layers])
    };
    let config = Config {
        model_type: c.model_type.clone(),
        hidden: c.hidden_size,
        layers: c.num_hidden_layers,
        intermediate: c.intermediate_size,
        heads: c.num_attention_heads,
        kv_heads,
        head_dim,
        eps: c.rms_norm_eps,
        vocab: c.vocab_size,
        qkv_bias,
        o_bias,
        mlp_bias: arch != "qwen2" && !qwen3 && c.mlp_bias,
        qk_norm: qwen3,
        tied,
        windows,
        quantization,
        context_length: c.max_position_embeddings,
        moe,
        sparse,
        sinks: gpt_oss,
        // mlx-lm: `head_dim ** -0.5`, gpt-oss `1 / math.sqrt(head_dim)`,
        // both in Python's doubles.
        scale: if gpt_oss {
            (1.0 / f64::from(head_dim).sqrt()) as f32
        } else {
            f64::from(head_dim).powf(-0.5) as f32
        },
    };
    Ok((config, rope))
}
