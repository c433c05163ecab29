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
    let quantize = Script::read(SCRIPT)?;
    let mut out = Vec::new();
    for copy in COPIES {
        let quantization = (copy.quantization)();
        out.push(derive(
            python,
            &quantize,
            Derived {
                source: copy.source,
                name: copy.name,
                note: &format!("quantized by mlx-lm with {quantization}\n"),
                verb: "quantizing",
                args: &["--quantization".to_owned(), quantization.to_string()],
            },
            sources,
        )?);
    }
    // `gpt-oss-hub`: the float `gpt-oss` as OpenAI ships gpt-oss on the
    // hub (`gpt_oss_hf.py`: MX blocks, fused alternating `gate_up_proj`,
    // `quant_method` mxfp4), which mlx-lm's `sanitize` and ours rewrite at
    // load.
    out.push(derive(
        python,
        &Script::read(HUB_SCRIPT)?,
        Derived {
            source: "gpt-oss",
            name: "gpt-oss-hub",
            note: "hub layout, ",
            verb: "rewriting",
            args: &[],
        },
        sources,
    )?);
    Ok(out)
}

/// A script of the repository and the hash its outputs' stamps record.
struct Script {
    path: std::path::PathBuf,
    hash: u64,
}

impl Script {
    fn read(relative: &str) -> Result<Self> {
        let path = shell::root().join(relative);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Self {
            hash: fnv1a64(&bytes),
            path,
        })
    }
}

/// One checkpoint a script writes from a float one.
struct Derived<'a> {
    source: &'a str,
    name: &'a str,
    /// What its stamp says of it, before the script's hash.
    note: &'a str,
    /// The progress line's verb.
    verb: &'a str,
    /// The script's arguments after `--src` and `--dst`.
    args: &'a [String],
}

/// `derived` written by `script` from its float source, unless the copy
/// there is current (its stamp: the source's, the note, the script's hash).
fn derive(
    python: &Path,
    script: &Script,
    derived: Derived<'_>,
    sources: &[Checkpoint],
) -> Result<Checkpoint> {
    let src = &sources
        .iter()
        .find(|c| c.name == derived.source)
        .with_context(|| format!("no float checkpoint `{}`", derived.source))?
        .dir;
    let src_stamp = std::fs::read_to_string(src.join(STAMP))
        .with_context(|| format!("reading {}", src.join(STAMP).display()))?;
    let stamp = format!(
        "{src_stamp}{}script fnv1a64 {:016x}\n",
        derived.note, script.hash
    );
    let dir = models_dir().join(derived.name);
    if !is_current(&dir, &stamp) {
        eprintln!("{} {} into {}", derived.verb, src.display(), dir.display());
        replace_dir(&dir, &stamp, |tmp| {
            shell::run(
                venv::python_command(python)
                    .arg(&script.path)
                    .arg("--src")
                    .arg(src)
                    .arg("--dst")
                    .arg(tmp)
                    .args(derived.args),
            )
        })?;
    }
    Ok(Checkpoint {
        name: derived.name.to_owned(),
        dir,
    })
}
