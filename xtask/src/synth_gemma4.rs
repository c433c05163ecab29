//! The gates' synthetic Gemma-4 checkpoints on disk (float32, fixed seed,
//! layouts in `spec_fixtures::gemma4`):
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
use spec_fixtures::gemma4::{self, Gemma4};
use spec_fixtures::rng::fnv1a64;

use crate::synth::{self, Checkpoint};
use crate::{shell, venv};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 2;

/// Shorter than most gate prompts, so the windows rotate.
pub const SLIDING_WINDOW: usize = gemma4::GATE_SLIDING_WINDOW;

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
    let stamp_of = |v: &Gemma4| {
        format!(
            "gemma4 generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
            synth::SEED,
            v.config()
        )
    };
    for v in gemma4::GATE {
        let dir = base.join(v.name);
        let stamp = stamp_of(v);
        if !synth::is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            synth::replace_dir(&dir, &stamp, |tmp| Ok(v.write(tmp)?))?;
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
        let v = gemma4::GATE
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
