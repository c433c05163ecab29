//! Project automation: `cargo xtask <task>`. One file per task.
//!
//! - `demo`: set the machine up and show the engine working.
//! - `test`: everything CI checks (`.ci/run` runs exactly this).
//! - `bench <name>`: benchmarks that print ratios against a reference run.
//! - `gate [NAME...]`: our engine against reference implementations.

mod adapters;
mod bench;
mod demo;
mod fuzz;
mod gate;
mod prereqs;
mod real_model;
mod reference_env;
mod runs;
mod shell;
mod structured_cases;
mod synth;
mod synth_assistant;
mod synth_dflash;
mod synth_dspark;
mod synth_eagle3;
mod synth_gemma4;
mod synth_glm;
mod synth_modes;
mod synth_qwen3_next;
mod test;
mod tidy;
mod timing;
mod venv;

use anyhow::{bail, Result};

fn usage() -> String {
    let gates: String = gate::GATES
        .iter()
        .map(|g| format!("\n  {:<14}  {}", g.name, g.checks))
        .collect();
    format!(
        "usage: cargo xtask <task>

tasks:
  demo            install prerequisites if needed, then answer a question with the default model
  test            install prerequisites if needed, then run every test and gate CI runs
  gate [NAME...]  checks against references, every gate without a NAME (--model DIR adds a real
                  mlx-lm checkpoint to parity)
  bench NAME      blas | decode | spec | dspark | assistant: ratios against a reference run in the same invocation
  fuzz            cargo-fuzz the weights-file parsers (--seconds N, --target NAME)
  synth           write (or refresh) the synthetic gate checkpoints and print their directories

gates:{gates}"
    )
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("demo") => demo::run(rest),
        Some("test") => test::run(rest),
        Some("bench") => bench::run(rest),
        Some("fuzz") => fuzz::run(rest),
        Some("gate") => gate::run(rest),
        Some("synth") => synth::print_all(),
        Some("help" | "--help" | "-h") | None => {
            println!("{}", usage());
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}`\n\n{}", usage()),
    }
}
