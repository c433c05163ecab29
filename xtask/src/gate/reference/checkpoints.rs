//! The reference gate's checkpoints: written by transformers itself
//! (`save_pretrained` of a seeded random init, `reference_lm.py`), so they
//! are in the Hugging Face layout a user downloads, not in mlx-lm's. Cached
//! under `target/gate-models/reference-*`, stamped like the other synthetic
//! models: regenerated only when the config, the seed, the script or the
//! reference environment changes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use spec_fixtures::rng::fnv1a64;

use crate::synth::{is_current, models_dir, replace_dir};
use crate::{reference_env, shell};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 1;

pub(super) const SCRIPT: &str = "xtask/python/reference_lm.py";

/// One checkpoint: a transformers config (its `model_type` picks the
/// class), the seed of its weights and how `save_pretrained` writes them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spec {
    pub name: &'static str,
    pub seed: u64,
    pub config: fn() -> Value,
    /// `save_original_format`: true (transformers' default) writes the
    /// published per-expert tensors, false its own fused expert tensors.
    pub original_format: bool,
}

/// Vocabulary of every checkpoint (the prompts draw from it).
pub(super) const VOCAB: u64 = 256;

/// The GLM-5.2 schema (`glm_moe_dsa`) at toy sizes: MLA attention, the DSA
/// indexer keeping `index_topk` 8 keys (prompts and generations run far
/// past it), MoE from layer 1 on (8 routed experts, top 2, one shared).
/// Sixteen indexer heads make an exactly-zero index score (all heads'
/// ReLUs zero, a tie two frameworks may break differently) unlikely.
/// `topk_method`, `scoring_func`, `moe_layer_freq` and
/// `num_nextn_predict_layers` are keys of the published GLM-5.x configs
/// that transformers keeps as they are.
fn glm(indexer_types: &[&str]) -> Value {
    json!({
        "model_type": "glm_moe_dsa",
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": indexer_types.len(),
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32, "v_head_dim": 24,
        "index_topk": 8, "index_head_dim": 32, "index_n_heads": 16,
        "indexer_types": indexer_types,
        "max_position_embeddings": 512,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
        "num_nextn_predict_layers": 1,
    })
}

/// Gemma-4 text at toy sizes: sliding layers (window 16, shorter than most
/// prompts) and full ones (global head width 32 with proportional RoPE,
/// keys doubling as values with one key/value head), tied embeddings, logit
/// softcapping. transformers writes the full layers' widths as
/// `per_layer_config`.
fn gemma4() -> Value {
    json!({
        "model_type": "gemma4_text",
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 5,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "global_head_dim": 32, "attention_k_eq_v": true, "num_global_key_value_heads": 1,
        "sliding_window": 16, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": VOCAB, "max_position_embeddings": 512,
        "final_logit_softcapping": 30.0,
    })
}

/// Gemma-4 text with what the small and the MoE releases add: the last two
/// layers reuse the keys and values of the last earlier layer of their kind
/// (KV sharing, double-wide MLPs there), per-layer inputs, and a
/// mixture-of-experts block beside every MLP (transformers writes its
/// experts fused: `experts.gate_up_proj`, `experts.down_proj`).
fn gemma4_shared_moe() -> Value {
    json!({
        "model_type": "gemma4_text",
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "global_head_dim": 32, "sliding_window": 16,
        "num_kv_shared_layers": 2, "use_double_wide_mlp": true,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB,
        "enable_moe_block": true, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
        "max_position_embeddings": 512, "final_logit_softcapping": 30.0,
    })
}

/// The multimodal wrapper Gemma-4 ships as (`Gemma4ForConditionalGeneration`,
/// here without vision or audio towers): the text model's tensors under
/// `model.language_model.*`, its config under `text_config` (the vocabulary
/// only there).
fn gemma4_wrapper() -> Value {
    json!({
        "model_type": "gemma4", "text_config": gemma4(),
        "vision_config": null, "audio_config": null,
    })
}

/// The Gated DeltaNet and attention geometry the hybrids share: two key
/// heads, each serving two value heads, conv kernel 4; gated attention with
/// four query and two key/value heads of width 16.
fn hybrid_text(layers: usize, layer_types: &[&str]) -> Value {
    json!({
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": layers, "layer_types": layer_types,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "max_position_embeddings": 512,
    })
}

/// Adds `extra`'s keys to `base` (both objects).
fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

/// Qwen3-Next: every third layer gated attention (transformers writes the
/// pattern as `layer_types` only), half of each head rotated; expert blocks
/// on every second layer (`decoder_sparse_step`) except layer 3
/// (`mlp_only_layers`), so dense and expert layers meet both mixers.
/// Written in the published per-expert layout.
fn qwen3_next() -> Value {
    let l = "linear_attention";
    let f = "full_attention";
    with(
        hybrid_text(6, &[l, l, f, l, l, f]),
        json!({
            "model_type": "qwen3_next",
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48, "norm_topk_prob": true,
            "decoder_sparse_step": 2, "mlp_only_layers": [3],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        }),
    )
}

/// A vision tower as small as transformers builds one: the loaders must
/// drop its tensors (`model.visual.*`).
fn qwen3_5_vision() -> Value {
    json!({
        "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 4, "num_position_embeddings": 16,
    })
}

/// Qwen3.5's RoPE parameters: a quarter of each head rotated, the
/// multimodal sections (plain RoPE on text positions).
fn qwen3_5_rope() -> Value {
    json!({
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0], "mrope_interleaved": true,
    })
}

/// `Qwen3_5ForConditionalGeneration` as published: the text model under
/// `model.language_model.*` with its config in `text_config`, a vision
/// tower beside it; every second layer gated attention.
fn qwen3_5() -> Value {
    let (l, f) = ("linear_attention", "full_attention");
    json!({
        "model_type": "qwen3_5",
        "text_config": with(
            hybrid_text(4, &[l, f, l, f]),
            json!({"model_type": "qwen3_5_text", "rope_parameters": qwen3_5_rope()}),
        ),
        "vision_config": qwen3_5_vision(),
    })
}

/// `Qwen3_5MoeForConditionalGeneration`: every layer an expert block (the
/// picked probabilities renormalised, transformers' only choice), the
/// published interval of four. Written with transformers' fused expert
/// tensors, the layout the Qwen3.5 MoE checkpoints ship in and mlx-lm
/// reads.
fn qwen3_5_moe() -> Value {
    let (l, f) = ("linear_attention", "full_attention");
    let mut text = with(
        hybrid_text(4, &[l, l, l, f]),
        json!({
            "model_type": "qwen3_5_moe_text", "rope_parameters": qwen3_5_rope(),
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
        }),
    );
    if let Some(t) = text.as_object_mut() {
        t.remove("intermediate_size");
    }
    json!({"model_type": "qwen3_5_moe", "text_config": text, "vision_config": qwen3_5_vision()})
}

pub(super) const SPECS: &[Spec] = &[
    Spec {
        name: "glm-every-layer-full",
        seed: 0x676c_6d31,
        config: || glm(&["full"; 4]),
        original_format: true,
    },
    // GLM-5.2's IndexShare: shared layers have no indexer and reuse the
    // top-k of the last full layer before them (once, then twice in a row).
    Spec {
        name: "glm-indexshare",
        seed: 0x676c_6d32,
        config: || glm(&["full", "shared", "full", "shared", "shared"]),
        original_format: true,
    },
    Spec {
        name: "glm-indexshare-fused-experts",
        seed: 0x676c_6d33,
        config: || glm(&["full", "full", "shared", "shared"]),
        original_format: false,
    },
    Spec {
        name: "gemma4-text",
        seed: 0x6765_6d34,
        config: gemma4,
        original_format: true,
    },
    Spec {
        name: "gemma4-text-kv-shared-moe",
        seed: 0x6765_6d35,
        config: gemma4_shared_moe,
        original_format: true,
    },
    Spec {
        name: "gemma4-wrapper",
        seed: 0x6765_6d36,
        config: gemma4_wrapper,
        original_format: true,
    },
    Spec {
        name: "qwen3-next-moe",
        seed: 0x7177_6e31,
        config: qwen3_next,
        original_format: true,
    },
    Spec {
        name: "qwen3-5",
        seed: 0x7177_6e32,
        config: qwen3_5,
        original_format: true,
    },
    Spec {
        name: "qwen3-5-moe-fused-experts",
        seed: 0x7177_6e33,
        config: qwen3_5_moe,
        original_format: false,
    },
];

/// Where `spec` lives.
pub(super) fn dir(spec: &Spec) -> PathBuf {
    models_dir().join(format!("reference-{}", spec.name))
}

/// Makes sure every checkpoint exists and is current; returns their
/// directories in `SPECS` order.
pub(super) fn ensure(python: &Path) -> Result<Vec<PathBuf>> {
    let script = shell::root().join(SCRIPT);
    let script_text =
        std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?;
    let work = shell::root().join("target").join("gate-reference");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let mut dirs = Vec::new();
    for spec in SPECS {
        let dir = dir(spec);
        let stamp = stamp(spec, fnv1a64(&script_text));
        if !is_current(&dir, &stamp) {
            eprintln!("writing {} with transformers", dir.display());
            replace_dir(&dir, &stamp, |tmp| {
                let plan = work.join(format!("write-{}.json", spec.name));
                let item = json!({
                    "config": (spec.config)(), "seed": spec.seed, "dir": tmp,
                    "original_format": spec.original_format,
                });
                std::fs::write(&plan, json!({ "write": [item] }).to_string())?;
                shell::run(
                    reference_env::python_command(python)
                        .arg(&script)
                        .arg(&plan),
                )
            })?;
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

fn stamp(spec: &Spec, script_hash: u64) -> String {
    format!(
        "generator {GENERATOR_VERSION}\nseed {:#x}\n{}\noriginal format {}\nscript fnv1a64 {script_hash:016x}\n{}",
        spec.seed,
        (spec.config)(),
        spec.original_format,
        reference_env::REQUIREMENTS.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positions per chunk of transformers' `torch_chunk_gated_delta_rule`.
    const DELTA_CHUNK: u64 = 64;

    #[test]
    fn specs_are_distinct_and_contexts_outrun_windows_and_chunks() {
        let mut names: Vec<&str> = SPECS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SPECS.len());
        for spec in SPECS {
            let config = (spec.config)();
            let c = config.get("text_config").unwrap_or(&config);
            assert_eq!(c["vocab_size"].as_u64(), Some(VOCAB), "{}", spec.name);
            let longer = |n: u64| {
                super::super::PROMPT_LENGTHS
                    .iter()
                    .filter(|&&l| l as u64 > n)
                    .count()
            };
            let window = c
                .get("index_topk")
                .or_else(|| c.get("sliding_window"))
                .and_then(Value::as_u64);
            if let Some(window) = window {
                assert!(
                    longer(window) >= 2,
                    "{}: two prompts longer than {window}",
                    spec.name
                );
                continue;
            }
            // A hybrid: a prompt of more than one chunk runs the chunked
            // rule across a chunk boundary.
            let hybrid = c["layer_types"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == "linear_attention"));
            assert!(
                hybrid && longer(DELTA_CHUNK) >= 1,
                "{}: a window, or linear attention and a prompt longer than {DELTA_CHUNK}",
                spec.name
            );
        }
    }
}
