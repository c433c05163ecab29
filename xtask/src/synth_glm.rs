//! The gates' synthetic `glm_moe_dsa` (GLM-5.x) checkpoints on disk: the
//! float one (`spec_fixtures::glm::Glm::gate()`, MTP row included) and
//! quantized copies (4-bit group 64, 8-bit group 32) from `quantize_synth.py`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use spec_fixtures::glm::Glm;
use spec_fixtures::rng::fnv1a64;

use crate::shell;
use crate::synth::{is_current, models_dir, replace_dir, Checkpoint, GENERATOR_VERSION, SEED};

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

const QUANTIZE_SCRIPT: &str = "xtask/python/quantize_synth.py";

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
