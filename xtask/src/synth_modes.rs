//! The parity gate's checkpoints in MLX's floating-point quantization modes
//! (mxfp4, nvfp4, mxfp8), written by mlx-lm itself (`quantize_mlx_lm.py`:
//! `mlx_lm.convert -q --q-mode M`'s steps) from the float synthetic ones: the
//! llama family (untied, and tied through `llama3`), GLM (`glm_moe_dsa`:
//! MLA's per-head projections and the routed experts through `gather_qmm`),
//! the hybrid `qwen3-next-moe` (Gated DeltaNet, gated attention, dense and
//! expert layers; its router and shared-expert gate at 8 bits group 64 in
//! affine mode, as mlx-lm's `qwen3_next` quant predicate writes them beside
//! the float modes), one checkpoint mixing modes per module, as mlx-lm's
//! quant predicates write them, and 4-bit affine copies of both hybrid
//! expert checkpoints and of `qwen3-moe` with the model's own predicate
//! (`quantize_synth.py`,
//! behind `synth.rs`'s affine copies, leaves routers float); and
//! `gpt-oss-hub`, the float `gpt-oss` in the layout OpenAI ships it in
//! (`gpt_oss_hf.py`). Regenerated when the source, the block or the script
//! changes.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use spec_fixtures::rng::fnv1a64;

use crate::synth::{is_current, models_dir, replace_dir, Checkpoint, STAMP};
use crate::{shell, venv};

const SCRIPT: &str = "xtask/python/quantize_mlx_lm.py";
const HUB_SCRIPT: &str = "xtask/python/gpt_oss_hf.py";

/// A copy: its name, its float source and what `quantize_mlx_lm.py` takes.
struct ModeCopy {
    name: &'static str,
    source: &'static str,
    quantization: fn() -> Value,
}

const COPIES: &[ModeCopy] = &[
    ModeCopy {
        name: "llama-mxfp4",
        source: "llama",
        quantization: || json!({"mode": "mxfp4"}),
    },
    ModeCopy {
        name: "llama-mxfp8",
        source: "llama",
        quantization: || json!({"mode": "mxfp8"}),
    },
    // Tied embeddings: the quantized table is also the head.
    ModeCopy {
        name: "llama3-nvfp4",
        source: "llama3",
        quantization: || json!({"mode": "nvfp4"}),
    },
    ModeCopy {
        name: "glm-mxfp4",
        source: "glm",
        quantization: || json!({"mode": "mxfp4"}),
    },
    ModeCopy {
        name: "glm-nvfp4",
        source: "glm",
        quantization: || json!({"mode": "nvfp4"}),
    },
    ModeCopy {
        name: "glm-mxfp8",
        source: "glm",
        quantization: || json!({"mode": "mxfp8"}),
    },
    // No per-module entries: mlx-lm applies the model's own
    // `quant_predicate` (routers and shared-expert gates 8 bits, group 64).
    ModeCopy {
        name: "qwen3-next-moe-mxfp4",
        source: "qwen3-next-moe",
        quantization: || json!({"mode": "mxfp4"}),
    },
    ModeCopy {
        name: "qwen3-next-moe-nvfp4",
        source: "qwen3-next-moe",
        quantization: || json!({"mode": "nvfp4"}),
    },
    ModeCopy {
        name: "qwen3-next-moe-mxfp8",
        source: "qwen3-next-moe",
        quantization: || json!({"mode": "mxfp8"}),
    },
    // Group 32 by default, so the routers' group 64 differs in both.
    ModeCopy {
        name: "qwen3-next-moe-q4g32",
        source: "qwen3-next-moe",
        quantization: || json!({"mode": "affine", "group_size": 32, "bits": 4}),
    },
    // Hugging Face's fused experts in, mlx-lm's switch layout out.
    ModeCopy {
        name: "qwen3-5-moe-q4g32",
        source: "qwen3-5-moe",
        quantization: || json!({"mode": "affine", "group_size": 32, "bits": 4}),
    },
    // Hugging Face's per-expert tensors in, stacked out, the router at 8
    // bits group 64 (`qwen3_moe`'s predicate).
    ModeCopy {
        name: "qwen3-moe-q4g32",
        source: "qwen3-moe",
        quantization: || json!({"mode": "affine", "group_size": 32, "bits": 4}),
    },
    // gpt-oss as its publishers ship it: mxfp4 (the router at 8 bits,
    // group 64, affine: `gpt_oss`'s predicate).
    ModeCopy {
        name: "gpt-oss-mxfp4",
        source: "gpt-oss",
        quantization: || json!({"mode": "mxfp4"}),
    },
    // mxfp4 by default, three modules in the other three modes (the
    // per-module entries mlx-lm's quant predicates write).
    ModeCopy {
        name: "llama-modes-mixed",
        source: "llama",
        quantization: || {
            json!({
                "mode": "mxfp4",
                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "mxfp8"},
                "model.layers.1.self_attn.v_proj": {"group_size": 16, "bits": 4, "mode": "nvfp4"},
                "lm_head": {"group_size": 64, "bits": 6, "mode": "affine"},
            })
        },
    },
];

/// Makes sure every copy exists and is current; `sources` are the float
/// checkpoints of `synth::ensure` and `synth_qwen3_next::ensure`.
pub fn ensure(python: &Path, sources: &[Checkpoint]) -> Result<Vec<Checkpoint>> {
    let script = shell::root().join(SCRIPT);
    let script_hash =
        fnv1a64(&std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?);
    let mut out = Vec::new();
    for copy in COPIES {
        let src = &sources
            .iter()
            .find(|c| c.name == copy.source)
            .with_context(|| format!("no float checkpoint `{}`", copy.source))?
            .dir;
        let src_stamp = std::fs::read_to_string(src.join(STAMP))
            .with_context(|| format!("reading {}", src.join(STAMP).display()))?;
        let quantization = (copy.quantization)();
        let stamp = format!(
            "{src_stamp}quantized by mlx-lm with {quantization}\nscript fnv1a64 {script_hash:016x}\n"
        );
        let dir = models_dir().join(copy.name);
        if !is_current(&dir, &stamp) {
            eprintln!("quantizing {} into {}", src.display(), dir.display());
            replace_dir(&dir, &stamp, |tmp| {
                shell::run(
                    venv::python_command(python)
                        .arg(&script)
                        .arg("--src")
                        .arg(src)
                        .arg("--dst")
                        .arg(tmp)
                        .arg("--quantization")
                        .arg(quantization.to_string()),
                )
            })?;
        }
        out.push(Checkpoint {
            name: copy.name.to_owned(),
            dir,
        });
    }
    out.push(gpt_oss_hub(python, sources)?);
    Ok(out)
}

/// `gpt-oss-hub`: the float `gpt-oss` as OpenAI ships gpt-oss on the
/// hub (`gpt_oss_hf.py`: MX blocks, fused alternating `gate_up_proj`,
/// `quant_method` mxfp4), which mlx-lm's `sanitize` and ours rewrite at
/// load.
fn gpt_oss_hub(python: &Path, sources: &[Checkpoint]) -> Result<Checkpoint> {
    let script = shell::root().join(HUB_SCRIPT);
    let script_hash =
        fnv1a64(&std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?);
    let src = &sources
        .iter()
        .find(|c| c.name == "gpt-oss")
        .context("no float checkpoint `gpt-oss`")?
        .dir;
    let src_stamp = std::fs::read_to_string(src.join(STAMP))
        .with_context(|| format!("reading {}", src.join(STAMP).display()))?;
    let stamp = format!("{src_stamp}hub layout, script fnv1a64 {script_hash:016x}\n");
    let dir = models_dir().join("gpt-oss-hub");
    if !is_current(&dir, &stamp) {
        eprintln!("rewriting {} into {}", src.display(), dir.display());
        replace_dir(&dir, &stamp, |tmp| {
            shell::run(
                venv::python_command(python)
                    .arg(&script)
                    .arg("--src")
                    .arg(src)
                    .arg("--dst")
                    .arg(tmp),
            )
        })?;
    }
    Ok(Checkpoint {
        name: "gpt-oss-hub".to_owned(),
        dir,
    })
}
