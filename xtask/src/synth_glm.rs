//! The gates' synthetic `glm_moe_dsa` (GLM-5.x) checkpoints on disk: the
//! float one (`spec_fixtures::glm::Glm::gate()`, MTP row included) and
//! quantized copies (4-bit group 64, 8-bit group 32) from `quantize_synth.py`.

use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use spec_fixtures::glm::Glm;

use crate::synth::{
    is_current, models_dir, quantized_copy, replace_dir, Checkpoint, GENERATOR_VERSION, SEED,
};

/// Bump when anything below changes what gets written.
const GLM_VERSION: u32 = 1;

pub const NAME: &str = "glm";

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

fn float_stamp() -> String {
    format!(
        "generator {GENERATOR_VERSION} glm {GLM_VERSION}\nseed {SEED:#x}\n{}\n",
        Glm::gate().config()
    )
}

/// Makes sure the GLM checkpoints exist and are current.
pub fn ensure(python: &Path) -> Result<Vec<Checkpoint>> {
    let base = models_dir();
    let dir = base.join(NAME);
    let stamp = float_stamp();
    if !is_current(&dir, &stamp) {
        eprintln!("generating synthetic checkpoint {}", dir.display());
        replace_dir(&dir, &stamp, |tmp| Ok(Glm::gate().write(tmp)?))?;
    }
    let mut out = vec![Checkpoint {
        name: NAME.to_owned(),
        dir: dir.clone(),
    }];
    for (name, block) in QUANTIZED {
        let qdir = base.join(name);
        quantized_copy(python, &dir, &stamp, &qdir, &block())?;
        out.push(Checkpoint {
            name: (*name).to_owned(),
            dir: qdir,
        });
    }
    Ok(out)
}
