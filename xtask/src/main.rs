//! Project automation: `cargo xtask <task>`. One file per task.
//!
//! - `demo`: set the machine up and show the engine working.
//! - `test`: everything CI checks (`.ci/run` runs exactly this).
//! - `bench <name>`: benchmarks that print ratios against a reference run.
//! - `gate [NAME...]`: our engine against reference implementations.

mod bench;
mod demo;
mod gate;
mod prereqs;
mod real_model;
mod rng;
mod shell;
mod synth;
mod test;
mod venv;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  demo            install prerequisites if needed, then run the demo
  test            install prerequisites if needed, then run every test CI runs
  bench blas      f32 matmul GFLOP/s: wired BLAS vs MLX's bundled reference BLAS
  gate [NAME...] [--model DIR]...
                  gates against reference implementations (default: all);
                  parity: our target models vs mlx-lm 0.32.2, greedy tokens and
                  logits, on synthetic checkpoints plus each --model DIR";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("demo") => demo::run(rest),
        Some("test") => test::run(rest),
        Some("bench") => bench::run(rest),
        Some("gate") => gate::run(rest),
        Some("help" | "--help" | "-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}`\n\n{USAGE}"),
    }
}
