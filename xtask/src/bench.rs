//! `cargo xtask bench <name>`: benchmarks printing ratios against a
//! reference run made in the same invocation.

use anyhow::{bail, Result};

use crate::{prereqs, shell};

pub fn run(args: &[String]) -> Result<()> {
    let (name, rest) = match args.split_first() {
        Some((name, rest)) => (name.as_str(), rest),
        None => bail!("usage: cargo xtask bench blas [--sizes 512,1024,2048] [--min-seconds S]"),
    };
    prereqs::ensure()?;
    match name {
        "blas" => shell::run(
            shell::cargo()
                .args(["run", "--release", "--quiet", "-p", "mlx-ext", "--example", "bench_blas", "--"])
                .args(rest),
        ),
        other => bail!("unknown benchmark `{other}` (known: blas)"),
    }
}
