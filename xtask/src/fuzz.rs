//! `cargo xtask fuzz [--seconds N] [--target NAME]`: runs the cargo-fuzz
//! targets of `crates/weights-guard/fuzz` (the safetensors and GGUF header
//! parsers) for a bounded time each, with a memory cap, so a crafted file
//! cannot make the checkers allocate or crash. Needs a nightly toolchain
//! (libFuzzer with sanitizers); cargo-fuzz is installed from crates.io when
//! missing. `cargo xtask test` runs a short smoke of each target where
//! cargo-fuzz is installed already ([`smoke_available`]): installing it
//! compiles for minutes on a fresh machine, the smoke fuzzes for seconds,
//! and the stable `smoke_fuzz` test covers the parsers everywhere.

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::gate::Counts;
use crate::shell;

const TARGETS: &[(&str, &str)] = &[
    ("safetensors_header", "safetensors.dict"),
    ("gguf_header", "gguf.dict"),
];

fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a nightly toolchain is installed (rustup cannot fetch one offline).
fn nightly_available() -> bool {
    quiet(Command::new("cargo").args(["+nightly", "--version"]))
}

fn cargo_fuzz_installed() -> bool {
    quiet(Command::new("cargo").args(["fuzz", "--version"]))
}

/// Why `cargo xtask test`'s fuzz smoke cannot run here, if it cannot: it
/// needs a nightly toolchain and cargo-fuzz, which it does not install.
pub fn smoke_unavailable() -> Option<&'static str> {
    if !nightly_available() {
        Some("no nightly toolchain (cargo-fuzz needs one)")
    } else if !cargo_fuzz_installed() {
        Some("cargo-fuzz is not installed (`cargo xtask fuzz` installs it)")
    } else {
        None
    }
}

fn ensure_cargo_fuzz() -> Result<()> {
    if cargo_fuzz_installed() {
        return Ok(());
    }
    shell::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

/// Runs each (or the named) target for `seconds`; returns targets that ran clean and those that failed.
pub fn fuzz(seconds: u64, only: Option<&str>) -> Result<Counts> {
    if !nightly_available() {
        bail!("fuzzing needs a nightly toolchain (`rustup toolchain install nightly`); the stable smoke test `cargo test -p weights-guard --test smoke_fuzz` runs without it");
    }
    ensure_cargo_fuzz()?;
    let dir = shell::root().join("crates").join("weights-guard");
    let mut counts = Counts::default();
    for (target, dict) in TARGETS.iter().filter(|(t, _)| only.is_none_or(|o| o == *t)) {
        let corpus = shell::root()
            .join("target")
            .join("fuzz-corpus")
            .join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        let seeds = dir.join("fuzz").join("seeds").join(target);
        let ok = shell::run(
            Command::new("cargo")
                .current_dir(&dir)
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .arg(&seeds)
                .arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg(format!("-dict=fuzz/{dict}"))
                .args([
                    "-malloc_limit_mb=64",
                    "-rss_limit_mb=1024",
                    "-print_final_stats=1",
                ]),
        );
        match ok {
            Ok(()) => counts.passed += 1,
            Err(e) => {
                eprintln!("fuzz {target}: {e:#}");
                counts.failed += 1;
            }
        }
    }
    if counts.passed + counts.failed == 0 {
        bail!("no fuzz target named {only:?} (known: safetensors_header, gguf_header)");
    }
    Ok(counts)
}

pub fn run(args: &[String]) -> Result<()> {
    let (mut seconds, mut only) = (60, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .context("--seconds needs a value")?
                    .parse()
                    .context("--seconds")?
            }
            "--target" => only = Some(it.next().context("--target needs a name")?.clone()),
            other => bail!("unknown option {other} (known: --seconds, --target)"),
        }
    }
    let counts = fuzz(seconds, only.as_deref())?;
    if counts.failed > 0 {
        bail!("{} fuzz target(s) found a problem", counts.failed);
    }
    Ok(())
}
