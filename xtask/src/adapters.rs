//! Fine-tuned adapters for the gate models, written on first use by
//! mlx-lm's own training preparation (`xtask/python/synth_adapter.py`), as
//! `mlx_lm.lora` lays them out: the `parity` gate's `--adapter-path` rows
//! and `lossless`' `/lora` setting.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::shell;

/// The adapter of `kind` (`lora`, `dora` or `full`) on the last `layers`
/// blocks of the checkpoint at `model` (named `name`), under
/// `target/gate-models/NAME-adapters/KIND-LAYERS`.
pub fn ensure(
    python: &Path,
    model: &Path,
    name: &str,
    kind: &str,
    layers: usize,
) -> Result<PathBuf> {
    let dir = shell::root()
        .join("target")
        .join("gate-models")
        .join(format!("{name}-adapters"))
        .join(format!("{kind}-{layers}"));
    let complete = ["adapter_config.json", "adapters.safetensors"]
        .iter()
        .all(|f| dir.join(f).exists());
    if !complete {
        let mut cmd = crate::venv::python_command(python);
        cmd.arg(shell::root().join("xtask/python/synth_adapter.py"))
            .arg(model)
            .arg(&dir)
            .args([
                "--kind",
                kind,
                "--layers",
                &layers.to_string(),
                "--seed",
                "7",
            ]);
        shell::run(&mut cmd)
            .with_context(|| format!("writing {name}'s {kind} adapter with mlx-lm"))?;
    }
    Ok(dir)
}
