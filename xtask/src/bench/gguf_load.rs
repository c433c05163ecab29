//! `cargo xtask bench gguf-load`: peak resident memory of loading a quantized
//! GGUF model and decoding a few tokens, kept quantized (`--keep-dtype`)
//! against the same file loaded as float32, the float32 file itself, and
//! MLX's own GGUF reader on the file (`mx.load`, what a loader built on it
//! holds before anything else). The model and the measurements are
//! `xtask/python/bench_gguf_load.py`'s: a llama of about 140M parameters
//! with the default model's tokenizer, in `gguf_requant.py`'s Q4_K_M-like
//! mix.
//!
//! Options: `--prompt P`, `--max-tokens N` (default 16).

use anyhow::{Context, Result};

use crate::{shell, venv};

const SCRIPT: &str = "xtask/python/bench_gguf_load.py";

pub fn run(args: &[String]) -> Result<()> {
    let python = venv::ensure()?;
    shell::run(shell::cargo().args(["build", "--release", "-q", "-p", "mlx-spec", "--bins"]))?;
    let tokenizer = spec_hub::default_model().context("the default model's GGUF file")?;
    let mut cmd = venv::python_command(&python);
    cmd.arg(shell::root().join(SCRIPT))
        .arg("--engine")
        .arg(shell::out_dir().join("mlx-spec"))
        .arg("--tokenizer-from")
        .arg(tokenizer)
        .arg("--out")
        .arg(
            shell::root()
                .join("target")
                .join("bench-models")
                .join("gguf-load"),
        )
        .args(args);
    println!("CPU: {}", super::cpu_model());
    shell::run(&mut cmd)
}
