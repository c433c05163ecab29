//! The gates' synthetic `glm_moe_dsa` (GLM-5.x) checkpoints on disk: the
//! float GLM-5-schema one (`spec_fixtures::glm::Glm::gate()`, MTP row
//! included) with quantized copies (4-bit group 64, 8-bit group 32), and the
//! GLM-5.2-schema one (`Glm::glm52_gate()`: IndexShare, the MTP row's
//! indexer) with a 4-bit copy; the copies come from `quantize_synth.py`.

use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use spec_fixtures::glm::Glm;

use crate::synth::{
    is_current, models_dir, quantized_copy, replace_dir, Checkpoint, GENERATOR_VERSION, SEED,
};

/// Bump when anything below changes what gets written.
const GLM_VERSION: u32 = 2;

/// Every GLM gate model's name starts with this.
pub const NAME: &str = "glm";

/// Makes an mlx-lm quantization block.
type Block = fn() -> Value;

fn q4g64() -> Value {
    json!({"group_size": 64, "bits": 4, "mode": "affine"})
}

/// GLM-5.2 as the MLX community ships it (mxfp4), with the MTP row's
/// experts at 8 bits (`mxfp8`), as `docs/GLM.md` advises for drafting.
fn glm52_mxfp4() -> Value {
    let mtp = Glm::glm52_gate().layers;
    let mut block = json!({"group_size": 32, "bits": 4, "mode": "mxfp4"});
    for m in ["gate_proj", "up_proj", "down_proj"] {
        block[format!("model.layers.{mtp}.mlp.switch_mlp.{m}")] =
            json!({"group_size": 32, "bits": 8, "mode": "mxfp8"});
    }
    block
}

/// The float checkpoints and their quantized copies (name, block).
fn specs() -> [(Glm, &'static [(&'static str, Block)]); 2] {
    [
        (
            Glm::gate(),
            &[
                ("glm-q4g64", q4g64),
                (
                    "glm-q8g32",
                    || json!({"group_size": 32, "bits": 8, "mode": "affine"}),
                ),
            ],
        ),
        (
            Glm::glm52_gate(),
            &[("glm52-q4g64", q4g64), ("glm52-mxfp4", glm52_mxfp4)],
        ),
    ]
}

/// Whether mlx-lm 0.32.2 implements the gate model `name`: it has no
/// IndexShare, so the GLM-5.2-schema models stay out of the gates that run
/// mlx-lm on them (`parity`, `quantize`); the `reference` gate compares them
/// with transformers.
pub fn mlx_lm_implements(name: &str) -> bool {
    !name.starts_with("glm52")
}

fn float_stamp(spec: &Glm) -> String {
    format!(
        "generator {GENERATOR_VERSION} glm {GLM_VERSION}\nseed {SEED:#x}\n{}\n",
        spec.config()
    )
}

/// Makes sure the GLM checkpoints exist and are current.
pub fn ensure(python: &Path) -> Result<Vec<Checkpoint>> {
    let base = models_dir();
    let mut out = Vec::new();
    for (spec, quantized) in specs() {
        let dir = base.join(spec.name);
        let stamp = float_stamp(&spec);
        if !is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            replace_dir(&dir, &stamp, |tmp| Ok(spec.write(tmp)?))?;
        }
        out.push(Checkpoint {
            name: spec.name.to_owned(),
            dir: dir.clone(),
        });
        for (name, block) in quantized {
            let qdir = base.join(name);
            quantized_copy(python, &dir, &stamp, &qdir, &block())?;
            out.push(Checkpoint {
                name: (*name).to_owned(),
                dir: qdir,
            });
        }
    }
    Ok(out)
}
