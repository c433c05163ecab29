//! The environment of the model publishers' reference code: PyTorch and
//! transformers (`models/glm_moe_dsa`, `models/gemma4`, the Gemma-4
//! assistant's candidate generator) and SpecForge's EAGLE-3 draft model. It is large (torch's Linux wheel pulls
//! the CUDA libraries, about 5.6 GB installed, unused on a CPU), so it lives
//! in the shared cache (`spec_hub::cache_root()`), not in the clone:
//! every clone on one machine installs it once. Gate `reference` uses it; the
//! engine never does.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

/// Exactly what the environment holds, installed in one `pip install`.
pub const REQUIREMENTS: &[&str] = &[
    "torch==2.15.0",
    "transformers==5.24.0",
    "safetensors==0.8.0",
    "numpy==2.4.6",
];

/// Installed with `--no-deps` after the rest: SpecForge (the EAGLE-3
/// reference of gate `eagle3`) pins other torch and transformers versions
/// than ours, and its draft model imports cleanly with ours.
pub const NO_DEPS: &[&str] = &["specforge==0.2.0"];

/// The environment's directory: named by a hash of `REQUIREMENTS`, so a
/// changed list builds a new one beside the old.
pub fn dir() -> Result<PathBuf> {
    let root = spec_hub::cache_root().context("locating the cache directory")?;
    Ok(root.join(format!("reference-env-{:016x}", fnv1a(&marker_text()))))
}

/// Creates the environment when needed; returns its `python`.
pub fn ensure() -> Result<PathBuf> {
    let dir = dir()?;
    let python = crate::venv::pinned(&dir, "reference environment", REQUIREMENTS)?;
    crate::venv::ensure_no_deps(&dir, &python, NO_DEPS)?;
    Ok(python)
}

/// A command running the environment's `python` on the CPU with one
/// deterministic setup (no CUDA device is looked for).
pub fn python_command(python: &std::path::Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.env("CUDA_VISIBLE_DEVICES", "")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TOKENIZERS_PARALLELISM", "false");
    cmd
}

fn marker_text() -> String {
    REQUIREMENTS.iter().map(|r| format!("{r}\n")).collect()
}

/// 64-bit FNV-1a: a stable name for a requirement list.
pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
