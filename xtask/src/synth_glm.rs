//! Small synthetic `glm_moe_dsa` (GLM-5.x) checkpoints: the real config
//! schema and mlx-lm's tensor names (stacked `switch_mlp` experts,
//! `embed_q` / `unembed_out`), three decoder layers (one dense, two MoE),
//! eight experts in two groups, a DSA indexer whose `index_topk` (24) sits
//! inside the gates' context lengths, and the MTP row at layer index
//! `num_hidden_layers`, which mlx-lm drops and our loader keeps. Quantized
//! copies (4-bit group 64, 8-bit group 32) come from `quantize_synth.py`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::rng::fnv1a64;
use crate::shell;
use crate::synth::{
    is_current, models_dir, replace_dir, values, write_f32_safetensors, Checkpoint, Init,
    GENERATOR_VERSION, SEED,
};

/// Bump when anything below changes what gets written.
const GLM_VERSION: u32 = 1;

pub const NAME: &str = "glm";
const HIDDEN: usize = 64;
const LAYERS: usize = 3;
const VOCAB: usize = 320;
const HEADS: usize = 4;
const Q_LORA: usize = 64;
const KV_LORA: usize = 64;
const QK_NOPE: usize = 64;
const QK_ROPE: usize = 32;
const V_HEAD: usize = 64;
const INDEX_HEADS: usize = 2;
const INDEX_HEAD_DIM: usize = 64;
/// Below the longer gate prompts, above the shorter ones: prefill and decode
/// run both dense and sparse.
pub const INDEX_TOPK: usize = 24;
const INTERMEDIATE: usize = 128;
const MOE_INTERMEDIATE: usize = 64;
const EXPERTS: usize = 8;
const SHARED_EXPERTS: usize = 1;
const FIRST_DENSE: usize = 1;

const WEIGHT_STD: f64 = 0.25;
const EMBED_STD: f64 = 0.5;
const NORM_STD: f64 = 0.1;
const BIAS_STD: f64 = 0.1;

/// Makes an mlx-lm quantization block.
type Block = fn() -> Value;

/// The quantized copies: name and mlx-lm quantization block.
const QUANTIZED: &[(&str, Block)] = &[
    (
        "glm-q4g64",
        || json!({"group_size": 64, "bits": 4, "mode": "affine"}),
    ),
    (
        "glm-q8g32",
        || json!({"group_size": 32, "bits": 8, "mode": "affine"}),
    ),
];

const QUANTIZE_SCRIPT: &str = "xtask/python/quantize_synth.py";

pub fn config() -> Value {
    json!({
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "index_head_dim": INDEX_HEAD_DIM,
        "index_n_heads": INDEX_HEADS,
        "index_topk": INDEX_TOPK,
        "intermediate_size": INTERMEDIATE,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_shared_experts": SHARED_EXPERTS,
        "n_routed_experts": EXPERTS,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": KV_LORA,
        "q_lora_rank": Q_LORA,
        "qk_rope_head_dim": QK_ROPE,
        "v_head_dim": V_HEAD,
        "qk_nope_head_dim": QK_NOPE,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": true,
        "n_group": 2,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": FIRST_DENSE,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "attention_bias": false,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    })
}

/// Every tensor, named as mlx-lm names them after `sanitize`, MTP row included.
pub fn tensors() -> Vec<(String, Vec<usize>, Init)> {
    let w = Init::Normal(WEIGHT_STD);
    let norm = Init::OnePlusNormal(NORM_STD);
    let mut t = vec![
        (
            "model.embed_tokens.weight".to_owned(),
            vec![VOCAB, HIDDEN],
            Init::Normal(EMBED_STD),
        ),
        ("model.norm.weight".to_owned(), vec![HIDDEN], norm),
        ("lm_head.weight".to_owned(), vec![VOCAB, HIDDEN], w),
    ];
    for i in 0..=LAYERS {
        let p = format!("model.layers.{i}");
        let mut add =
            |name: &str, shape: Vec<usize>, init| t.push((format!("{p}.{name}"), shape, init));
        add("input_layernorm.weight", vec![HIDDEN], norm);
        add("post_attention_layernorm.weight", vec![HIDDEN], norm);
        add("self_attn.q_a_proj.weight", vec![Q_LORA, HIDDEN], w);
        add("self_attn.q_a_layernorm.weight", vec![Q_LORA], norm);
        add(
            "self_attn.q_b_proj.weight",
            vec![HEADS * (QK_NOPE + QK_ROPE), Q_LORA],
            w,
        );
        add(
            "self_attn.kv_a_proj_with_mqa.weight",
            vec![KV_LORA + QK_ROPE, HIDDEN],
            w,
        );
        add("self_attn.kv_a_layernorm.weight", vec![KV_LORA], norm);
        add("self_attn.embed_q.weight", vec![HEADS, KV_LORA, QK_NOPE], w);
        add(
            "self_attn.unembed_out.weight",
            vec![HEADS, V_HEAD, KV_LORA],
            w,
        );
        add("self_attn.o_proj.weight", vec![HIDDEN, HEADS * V_HEAD], w);
        add(
            "self_attn.indexer.wq_b.weight",
            vec![INDEX_HEADS * INDEX_HEAD_DIM, Q_LORA],
            w,
        );
        add(
            "self_attn.indexer.wk.weight",
            vec![INDEX_HEAD_DIM, HIDDEN],
            w,
        );
        add(
            "self_attn.indexer.k_norm.weight",
            vec![INDEX_HEAD_DIM],
            norm,
        );
        add(
            "self_attn.indexer.k_norm.bias",
            vec![INDEX_HEAD_DIM],
            Init::Normal(BIAS_STD),
        );
        add(
            "self_attn.indexer.weights_proj.weight",
            vec![INDEX_HEADS, HIDDEN],
            w,
        );
        if i < FIRST_DENSE {
            add("mlp.gate_proj.weight", vec![INTERMEDIATE, HIDDEN], w);
            add("mlp.up_proj.weight", vec![INTERMEDIATE, HIDDEN], w);
            add("mlp.down_proj.weight", vec![HIDDEN, INTERMEDIATE], w);
        } else {
            add("mlp.gate.weight", vec![EXPERTS, HIDDEN], w);
            add(
                "mlp.gate.e_score_correction_bias",
                vec![EXPERTS],
                Init::Normal(BIAS_STD),
            );
            add(
                "mlp.switch_mlp.gate_proj.weight",
                vec![EXPERTS, MOE_INTERMEDIATE, HIDDEN],
                w,
            );
            add(
                "mlp.switch_mlp.up_proj.weight",
                vec![EXPERTS, MOE_INTERMEDIATE, HIDDEN],
                w,
            );
            add(
                "mlp.switch_mlp.down_proj.weight",
                vec![EXPERTS, HIDDEN, MOE_INTERMEDIATE],
                w,
            );
            let shared = MOE_INTERMEDIATE * SHARED_EXPERTS;
            add(
                "mlp.shared_experts.gate_proj.weight",
                vec![shared, HIDDEN],
                w,
            );
            add("mlp.shared_experts.up_proj.weight", vec![shared, HIDDEN], w);
            add(
                "mlp.shared_experts.down_proj.weight",
                vec![HIDDEN, shared],
                w,
            );
        }
        if i == LAYERS {
            add("enorm.weight", vec![HIDDEN], norm);
            add("hnorm.weight", vec![HIDDEN], norm);
            add("eh_proj.weight", vec![HIDDEN, 2 * HIDDEN], w);
            add("shared_head.norm.weight", vec![HIDDEN], norm);
        }
    }
    t
}

/// Writes the float checkpoint into `dir`.
pub fn write_checkpoint(dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config())? + "\n",
    )?;
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = tensors()
        .into_iter()
        .map(|(name, shape, init)| {
            let v = values(NAME, &name, shape.iter().product(), init);
            (name, shape, v)
        })
        .collect();
    write_f32_safetensors(&dir.join("model.safetensors"), &data)
}

fn float_stamp() -> String {
    format!(
        "generator {GENERATOR_VERSION} glm {GLM_VERSION}\nseed {SEED:#x}\n{}\n",
        config()
    )
}

/// Makes sure the GLM checkpoints exist and are current.
pub fn ensure(python: &Path) -> Result<Vec<Checkpoint>> {
    let base = models_dir();
    let dir = base.join(NAME);
    let stamp = float_stamp();
    if !is_current(&dir, &stamp) {
        eprintln!("generating synthetic checkpoint {}", dir.display());
        replace_dir(&dir, &stamp, write_checkpoint)?;
    }
    let mut out = vec![Checkpoint {
        name: NAME.to_owned(),
        dir: dir.clone(),
    }];
    let script = shell::root().join(QUANTIZE_SCRIPT);
    let script_text =
        std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?;
    for (name, block) in QUANTIZED {
        let block = block();
        let qdir: PathBuf = base.join(name);
        let qstamp = format!(
            "{stamp}quantized with {block}\nscript fnv1a64 {:016x}\n",
            fnv1a64(&script_text)
        );
        if !is_current(&qdir, &qstamp) {
            eprintln!("quantizing {} into {}", dir.display(), qdir.display());
            replace_dir(&qdir, &qstamp, |tmp| {
                shell::run(
                    Command::new(python)
                        .arg(&script)
                        .arg("--src")
                        .arg(&dir)
                        .arg("--dst")
                        .arg(tmp)
                        .arg("--quantization")
                        .arg(block.to_string()),
                )
            })?;
        }
        out.push(Checkpoint {
            name: (*name).to_owned(),
            dir: qdir,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes re-derived from the config alone, as mlx-lm's `deepseek_v32`
    /// builds its modules (plus the MTP row it drops).
    #[test]
    fn tensor_shapes_follow_the_config() {
        let c = config();
        let get = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
        let t = tensors();
        let find = |name: &str| {
            t.iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, s, _)| s.clone())
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
            find("model.layers.2.mlp.switch_mlp.down_proj.weight"),
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
                .all(|(n, _, _)| !n.contains("layers.0.mlp.switch_mlp")),
            "first_k_dense_replace layers are dense"
        );
        let mut names: Vec<&str> = t.iter().map(|(n, _, _)| n.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "no tensor twice");
    }
}
