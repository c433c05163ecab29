//! The gates' synthetic hybrid checkpoints (Gated DeltaNet and gated
//! attention layers, float32, fixed seed, layouts in
//! `spec_fixtures::qwen3_next`): `qwen3-next` in mlx-lm's layout and
//! `qwen3-5`, the same stack as a Hugging Face `qwen3_5` multimodal
//! checkpoint (a vision tower, which loaders drop, and an MTP head, which
//! `qwen3-native-mtp` drafts with and gate `mtp` checks),
//! each quantized to 4 bits (affine, group 32) by mlx-lm itself
//! (`quantize_synth.py`), `-q4g32`; and their expert-layer versions,
//! `qwen3-next-moe` (switch layout, every second layer) and `qwen3-5-moe`
//! (`qwen3_5_moe`, Hugging Face's fused experts), float here (their copies
//! quantized by mlx-lm, routers included, are `synth_modes.rs`'s). Kept
//! apart from `synth::ensure`: the
//! gates that take them (parity, invariance, and through
//! `suite::TARGET_DRAFTS` lossless and batch) ask for them by name.

use std::path::Path;

use serde_json::json;

use anyhow::Result;
use spec_fixtures::qwen3_next;

use crate::synth::{self, Checkpoint};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 2;

/// Makes sure every synthetic hybrid checkpoint under `base` is current;
/// `python` (the project venv's) makes the quantized copies.
pub fn ensure(base: &Path, python: &Path) -> Result<Vec<Checkpoint>> {
    let mut out = Vec::new();
    let all = [
        (qwen3_next::GATE, true),
        (qwen3_next::GATE_QWEN3_5, true),
        (qwen3_next::GATE_MOE, false),
        (qwen3_next::GATE_QWEN3_5_MOE, false),
    ];
    for (v, quantize) in all {
        let dir = base.join(v.name);
        let stamp = format!(
            "qwen3_next generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
            v.seed,
            v.config()
        );
        if !synth::is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            synth::replace_dir(&dir, &stamp, |tmp| Ok(v.write(tmp)?))?;
        }
        out.push(Checkpoint {
            name: v.name.to_owned(),
            dir: dir.clone(),
        });
        if !quantize {
            continue;
        }
        let name = format!("{}-q4g32", v.name);
        let quantized = base.join(&name);
        let block = json!({"group_size": 32, "bits": 4, "mode": "affine"});
        synth::quantized_copy(python, &dir, &stamp, &quantized, &block)?;
        out.push(Checkpoint {
            name,
            dir: quantized,
        });
    }
    Ok(out)
}
