//! `cargo xtask demo`: the MLX runtime this machine got, and how fast it
//! multiplies matrices.

use anyhow::{bail, Result};

use crate::{prereqs, shell};

pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask demo` takes no arguments");
    }
    prereqs::ensure()?;
    shell::run(shell::cargo().args([
        "run", "--release", "--quiet", "-p", "mlx-ext", "--example", "bench_blas", "--",
        "--sizes", "512,1024", "--min-seconds", "0.5",
    ]))
}
