//! Project automation: `cargo xtask <task>`. One file per task.
//!
//! - `demo`: set the machine up and show the engine working.
//! - `test`: everything CI checks (`.ci/run` runs exactly this).
//! - `bench <name>`: benchmarks that print ratios against a reference run.

mod bench;
mod demo;
mod prereqs;
mod shell;
mod test;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  demo            install prerequisites if needed, then run the demo
  test            install prerequisites if needed, then run every test CI runs
  bench blas      f32 matmul GFLOP/s: wired BLAS vs MLX's bundled reference BLAS";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("demo") => demo::run(rest),
        Some("test") => test::run(rest),
        Some("bench") => bench::run(rest),
        Some("help" | "--help" | "-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}`\n\n{USAGE}"),
    }
}
