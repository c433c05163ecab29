//! Small synthetic Gemma-4 checkpoints (float32, fixed seed), with the real
//! config schema and Hugging Face tensor names:
//!
//! - `gemma4-text`: a `gemma4_text` model with sliding and full layers, a
//!   sliding window of 8, proportional partial RoPE on full layers, an
//!   untied head;
//! - `gemma4-shared`: a `gemma4` wrapper (`text_config`, tensors under
//!   `model.language_model.`) with KV-shared layers, double-wide MLPs on
//!   them, per-layer inputs, `attention_k_eq_v` with its own key/value head
//!   count, a tied head, and the tensors mlx-lm's `sanitize` drops (a vision
//!   tower, the shared layers' unused key/value projections);
//! - `gemma4-moe`: the mixture-of-experts layout (4 experts, top 2, fused
//!   `experts.gate_up_proj` as Hugging Face stores it);
//! - `gemma4-shared-q8g32`: `gemma4-shared` quantized by mlx-lm itself.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::rng::fnv1a64;
use crate::synth::{self, Checkpoint, Init};
use crate::{shell, venv};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 2;

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const GLOBAL_HEAD_DIM: usize = 32;
const INTERMEDIATE: usize = 128;
const VOCAB: usize = 320;
/// Shorter than most gate prompts, so the windows rotate.
pub const SLIDING_WINDOW: usize = 8;
const MAX_POSITIONS: usize = 512;

const WEIGHT_STD: f64 = 0.25;
const EMBED_STD: f64 = 0.5;
const TIED_EMBED_STD: f64 = 0.05;
const NORM_STD: f64 = 0.1;

/// One synthetic Gemma-4 variant.
#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    /// `gemma4` wrapper (tensors under `model.language_model.`) or `gemma4_text`.
    wrapper: bool,
    layer_types: &'static [&'static str],
    kv_shared: usize,
    per_layer_input: Option<usize>,
    k_eq_v: bool,
    global_kv_heads: Option<usize>,
    tied: bool,
    double_wide: bool,
    /// Std of the embedding tables. A tied head reads the residual stream
    /// through the embedding table: with embeddings as large as the layers'
    /// outputs (times sqrt(hidden)) greedy decoding repeats the input token.
    embed_std: f64,
    /// Mixture of experts: (experts, top k, expert MLP width).
    moe: Option<(usize, usize, usize)>,
}

const S: &str = "sliding_attention";
const F: &str = "full_attention";

const VARIANTS: &[Variant] = &[
    Variant {
        name: "gemma4-text",
        wrapper: false,
        layer_types: &[S, S, F, S],
        kv_shared: 0,
        per_layer_input: None,
        k_eq_v: false,
        global_kv_heads: None,
        tied: false,
        double_wide: false,
        embed_std: EMBED_STD,
        moe: None,
    },
    Variant {
        name: "gemma4-shared",
        wrapper: true,
        layer_types: &[S, F, S, S, F],
        kv_shared: 2,
        per_layer_input: Some(16),
        k_eq_v: true,
        global_kv_heads: Some(1),
        tied: true,
        double_wide: true,
        embed_std: TIED_EMBED_STD,
        moe: None,
    },
    Variant {
        name: "gemma4-moe",
        wrapper: false,
        layer_types: &[S, F, S],
        kv_shared: 0,
        per_layer_input: None,
        k_eq_v: false,
        global_kv_heads: None,
        tied: false,
        double_wide: false,
        embed_std: EMBED_STD,
        moe: Some((4, 2, 32)),
    },
];

/// Quantized copies, made by mlx-lm's own `quantize_model` (so they are in
/// mlx-lm's saved layout: module paths, split experts, 8-bit routers).
/// `(name, source, group size, bits)`; group 32 divides every input width.
/// No quantized MoE copy: mlx-lm 0.32.2's `QuantizedSwitchLinear` passes
/// `global_scale` to mlx 0.32.2's `gather_qmm`, which rejects it, so the
/// oracle cannot run one.
const QUANTIZED: &[(&str, &str, usize, usize)] = &[("gemma4-shared-q8g32", "gemma4-shared", 32, 8)];

const QUANTIZE_SCRIPT: &str = "xtask/python/quantize_gemma4.py";

/// Makes sure every synthetic Gemma-4 checkpoint under `base` is current;
/// `python` (the project venv's) makes the quantized copies.
pub fn ensure(base: &Path, python: &Path) -> Result<Vec<Checkpoint>> {
    let mut out = Vec::new();
    let stamp_of = |v: &Variant| {
        format!(
            "gemma4 generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
            synth::SEED,
            config(v)
        )
    };
    for v in VARIANTS {
        let dir = base.join(v.name);
        let stamp = stamp_of(v);
        if !synth::is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            synth::replace_dir(&dir, &stamp, |tmp| write(v, tmp))?;
        }
        out.push(Checkpoint {
            name: v.name.to_owned(),
            dir,
        });
    }
    let script = shell::root().join(QUANTIZE_SCRIPT);
    let script_text =
        std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?;
    for &(name, source, group, bits) in QUANTIZED {
        let v = VARIANTS
            .iter()
            .find(|v| v.name == source)
            .context("quantized copy of an unknown gemma4 checkpoint")?;
        let (src, dir) = (base.join(source), base.join(name));
        let stamp = format!(
            "{}quantized group {group} bits {bits}\nscript fnv1a64 {:016x}\n",
            stamp_of(v),
            fnv1a64(&script_text)
        );
        if !synth::is_current(&dir, &stamp) {
            eprintln!("quantizing {} into {}", src.display(), dir.display());
            synth::replace_dir(&dir, &stamp, |tmp| {
                let mut cmd = venv::python_command(python);
                cmd.arg(&script)
                    .arg("--src")
                    .arg(&src)
                    .arg("--dst")
                    .arg(tmp);
                cmd.arg("--group-size")
                    .arg(group.to_string())
                    .arg("--bits")
                    .arg(bits.to_string());
                shell::run(&mut cmd)
            })?;
        }
        out.push(Checkpoint {
            name: name.to_owned(),
            dir,
        });
    }
    Ok(out)
}

fn text_config(v: &Variant) -> Value {
    json!({
        "model_type": "gemma4_text",
        "hidden_size": HIDDEN,
        "num_hidden_layers": v.layer_types.len(),
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_global_key_value_heads": v.global_kv_heads,
        "head_dim": HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
        "num_kv_shared_layers": v.kv_shared,
        "hidden_size_per_layer_input": v.per_layer_input.unwrap_or(0),
        "sliding_window": SLIDING_WINDOW,
        "layer_types": v.layer_types,
        "max_position_embeddings": MAX_POSITIONS,
        "attention_k_eq_v": v.k_eq_v,
        "final_logit_softcapping": 30.0,
        "use_double_wide_mlp": v.double_wide,
        "enable_moe_block": v.moe.is_some(),
        "num_experts": v.moe.map(|m| m.0),
        "top_k_experts": v.moe.map(|m| m.1),
        "moe_intermediate_size": v.moe.map(|m| m.2),
        "tie_word_embeddings": v.tied,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
        },
        "torch_dtype": "float32",
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    })
}

fn config(v: &Variant) -> Value {
    let mut text = text_config(v);
    if !v.wrapper {
        if let Some(map) = text.as_object_mut() {
            map.insert("architectures".into(), json!(["Gemma4ForCausalLM"]));
        }
        return text;
    }
    json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vocab_size": VOCAB,
        "tie_word_embeddings": v.tied,
        "torch_dtype": "float32",
    })
}

/// Every tensor of `v`, as a Hugging Face checkpoint names it.
fn tensors(v: &Variant) -> Vec<(String, Vec<usize>, Init)> {
    let p = if v.wrapper {
        "model.language_model"
    } else {
        "model"
    };
    let n = v.layer_types.len();
    let first_shared = n - v.kv_shared;
    let mut t = vec![(
        format!("{p}.embed_tokens.weight"),
        vec![VOCAB, HIDDEN],
        Init::Normal(v.embed_std),
    )];
    if let Some(w) = v.per_layer_input {
        t.push((
            format!("{p}.embed_tokens_per_layer.weight"),
            vec![VOCAB, n * w],
            Init::Normal(v.embed_std),
        ));
        t.push((
            format!("{p}.per_layer_model_projection.weight"),
            vec![n * w, HIDDEN],
            Init::Normal(WEIGHT_STD),
        ));
        t.push((
            format!("{p}.per_layer_projection_norm.weight"),
            vec![w],
            Init::OnePlusNormal(NORM_STD),
        ));
    }
    for (i, kind) in v.layer_types.iter().enumerate() {
        let full = *kind == F;
        let hd = if full { GLOBAL_HEAD_DIM } else { HEAD_DIM };
        let k_eq_v = v.k_eq_v && full;
        let kv_heads = if k_eq_v {
            v.global_kv_heads.unwrap_or(KV_HEADS)
        } else {
            KV_HEADS
        };
        let shared = i >= first_shared && first_shared > 0;
        let inter = if v.double_wide && shared {
            2 * INTERMEDIATE
        } else {
            INTERMEDIATE
        };
        let l = format!("{p}.layers.{i}");
        let mut add =
            |name: &str, shape: Vec<usize>, init| t.push((format!("{l}.{name}"), shape, init));
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(
                &format!("{norm}.weight"),
                vec![HIDDEN],
                Init::OnePlusNormal(NORM_STD),
            );
        }
        add(
            "self_attn.q_proj.weight",
            vec![HEADS * hd, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.q_norm.weight",
            vec![hd],
            Init::OnePlusNormal(NORM_STD),
        );
        // Hugging Face checkpoints carry key/value weights on KV-shared
        // layers too; loaders drop them.
        add(
            "self_attn.k_proj.weight",
            vec![kv_heads * hd, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.k_norm.weight",
            vec![hd],
            Init::OnePlusNormal(NORM_STD),
        );
        if !k_eq_v {
            add(
                "self_attn.v_proj.weight",
                vec![kv_heads * hd, HIDDEN],
                Init::Normal(WEIGHT_STD),
            );
        }
        add(
            "self_attn.o_proj.weight",
            vec![HIDDEN, HEADS * hd],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.gate_proj.weight",
            vec![inter, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.up_proj.weight",
            vec![inter, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.down_proj.weight",
            vec![HIDDEN, inter],
            Init::Normal(WEIGHT_STD),
        );
        if let Some(w) = v.per_layer_input {
            add(
                "per_layer_input_gate.weight",
                vec![w, HIDDEN],
                Init::Normal(WEIGHT_STD),
            );
            add(
                "per_layer_projection.weight",
                vec![HIDDEN, w],
                Init::Normal(WEIGHT_STD),
            );
            add(
                "post_per_layer_input_norm.weight",
                vec![HIDDEN],
                Init::OnePlusNormal(NORM_STD),
            );
        }
        if let Some((experts, _, width)) = v.moe {
            add(
                "router.proj.weight",
                vec![experts, HIDDEN],
                Init::Normal(WEIGHT_STD),
            );
            add("router.scale", vec![HIDDEN], Init::OnePlusNormal(NORM_STD));
            add(
                "router.per_expert_scale",
                vec![experts],
                Init::OnePlusNormal(NORM_STD),
            );
            // Hugging Face's fused layout; loaders split it.
            add(
                "experts.gate_up_proj",
                vec![experts, 2 * width, HIDDEN],
                Init::Normal(WEIGHT_STD),
            );
            add(
                "experts.down_proj",
                vec![experts, HIDDEN, width],
                Init::Normal(WEIGHT_STD),
            );
            for norm in [
                "post_feedforward_layernorm_1",
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_2",
            ] {
                add(
                    &format!("{norm}.weight"),
                    vec![HIDDEN],
                    Init::OnePlusNormal(NORM_STD),
                );
            }
        }
        add("layer_scalar", vec![1], Init::OnePlusNormal(NORM_STD));
    }
    t.push((
        format!("{p}.norm.weight"),
        vec![HIDDEN],
        Init::OnePlusNormal(NORM_STD),
    ));
    if !v.tied {
        t.push((
            "lm_head.weight".to_owned(),
            vec![VOCAB, HIDDEN],
            Init::Normal(WEIGHT_STD),
        ));
    }
    if v.wrapper {
        // Multimodal wrappers carry towers a text model drops.
        t.push((
            "model.vision_tower.patch_embedder.weight".to_owned(),
            vec![4, 4],
            Init::Normal(WEIGHT_STD),
        ));
    }
    t
}

fn write(v: &Variant, dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config(v))? + "\n",
    )?;
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = tensors(v)
        .into_iter()
        .map(|(name, shape, init)| {
            let values = synth::values(v.name, &name, shape.iter().product(), init);
            (name, shape, values)
        })
        .collect();
    synth::write_f32_safetensors(&dir.join("model.safetensors"), &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_exercise_what_they_claim() {
        let shared = VARIANTS
            .iter()
            .find(|v| v.name == "gemma4-shared")
            .expect("shared variant");
        assert!(
            shared.kv_shared > 0
                && shared.per_layer_input.is_some()
                && shared.k_eq_v
                && shared.wrapper
        );
        let names: Vec<String> = tensors(shared).into_iter().map(|(n, _, _)| n).collect();
        assert!(
            names.iter().all(|n| n.starts_with("model.")),
            "Hugging Face names: {names:?}"
        );
        assert!(
            names
                .iter()
                .any(|n| n.ends_with("layers.3.self_attn.k_proj.weight")),
            "shared layers carry unused k_proj"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with("layers.1.self_attn.v_proj.weight")),
            "k_eq_v full layers have no v_proj"
        );
        let config = config(shared);
        assert_eq!(config["text_config"]["num_kv_shared_layers"], 2);
        let plain = VARIANTS
            .iter()
            .find(|v| v.name == "gemma4-text")
            .expect("plain variant");
        assert!(plain.layer_types.contains(&F) && plain.layer_types.contains(&S));
    }

    #[test]
    fn double_wide_mlps_sit_on_shared_layers_only() {
        let shared = VARIANTS
            .iter()
            .find(|v| v.name == "gemma4-shared")
            .expect("shared variant");
        for (name, shape, _) in tensors(shared) {
            if name.ends_with("mlp.gate_proj.weight") {
                let layer: usize = name
                    .split("layers.")
                    .nth(1)
                    .and_then(|r| r.split('.').next())
                    .and_then(|i| i.parse().ok())
                    .expect("layer index");
                let wide = layer >= shared.layer_types.len() - shared.kv_shared;
                assert_eq!(
                    shape[0],
                    if wide { 2 * INTERMEDIATE } else { INTERMEDIATE },
                    "{name}"
                );
            }
        }
    }
}
