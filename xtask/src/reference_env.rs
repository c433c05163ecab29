//! The environment of the model publishers' reference code: PyTorch and
//! transformers (`models/glm_moe_dsa`, `models/gemma4`, the Gemma-4
//! assistant's candidate generator). It is large (torch's Linux wheel pulls
//! the CUDA libraries, about 5.6 GB installed, unused on a CPU), so it lives
//! in the shared cache (`spec_hub::cache_root()`), not in the clone:
//! every clone on one machine installs it once. Gate `reference` uses it; the
//! engine never does.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::shell;

/// Exactly what the environment holds, installed in one `pip install`.
pub const REQUIREMENTS: &[&str] = &[
    "torch==2.15.0",
    "transformers==5.24.0",
    "safetensors==0.8.0",
    "numpy==2.4.6",
];

/// Written inside the environment once the install succeeded; holds the
/// requirement list it was built from.
const MARKER: &str = "xtask-requirements.txt";

/// The environment's directory: named by a hash of `REQUIREMENTS`, so a
/// changed list builds a new one beside the old.
pub fn dir() -> Result<PathBuf> {
    let root = spec_hub::cache_root().context("locating the cache directory")?;
    Ok(root.join(format!("reference-env-{:016x}", fnv1a(&marker_text()))))
}

/// Creates the environment when needed; returns its `python`.
pub fn ensure() -> Result<PathBuf> {
    let dir = dir()?;
    let python = dir.join("bin").join("python");
    let wanted = marker_text();
    if python.exists()
        && std::fs::read_to_string(dir.join(MARKER)).ok().as_deref() == Some(wanted.as_str())
    {
        return Ok(python);
    }
    eprintln!(
        "creating the reference environment {} ({})",
        dir.display(),
        REQUIREMENTS.join(" ")
    );
    let start = std::time::Instant::now();
    shell::run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&dir),
    )?;
    shell::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(REQUIREMENTS),
    )?;
    if !python.exists() {
        bail!(
            "{} is missing after creating the environment",
            python.display()
        );
    }
    std::fs::write(dir.join(MARKER), &wanted)?;
    eprintln!(
        "reference environment ready in {:.1} s",
        start.elapsed().as_secs_f64()
    );
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
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
