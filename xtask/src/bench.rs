//! `cargo xtask bench <name>`: benchmarks printing ratios against a
//! reference run made in the same invocation.

mod agentic;
mod agentic_workload;
mod assistant;
mod decode;
mod dspark;
mod spec;

use anyhow::{bail, Result};

use crate::{prereqs, shell};

pub fn run(args: &[String]) -> Result<()> {
    let (name, rest) = match args.split_first() {
        Some((name, rest)) => (name.as_str(), rest),
        None => {
            bail!("usage: cargo xtask bench <blas|decode|spec|agentic|dspark|assistant> [options]")
        }
    };
    prereqs::ensure()?;
    match name {
        // The BLAS itself: our GEMM front forwards every product to it
        // (`bench decode` compares the front with OpenBLAS).
        "blas" => shell::run(
            shell::cargo()
                .args([
                    "run",
                    "--release",
                    "--quiet",
                    "-p",
                    "mlx-ext",
                    "--example",
                    "bench_blas",
                    "--",
                ])
                .args(rest)
                .env("MLX_SPEC_GEMM", "blas"),
        ),
        "decode" => decode::run(rest),
        "spec" => spec::run(rest),
        "agentic" => agentic::run(rest),
        "dspark" => dspark::run(rest),
        "assistant" => assistant::run(rest),
        other => {
            bail!("unknown benchmark `{other}` (known: blas, decode, spec, agentic, dspark, assistant)")
        }
    }
}
