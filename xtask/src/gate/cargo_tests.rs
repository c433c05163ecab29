//! Gates that are cargo tests at heart, run here so `cargo xtask gate`
//! covers every check the speculative issue asks of it:
//! - `rejection`: rejection sampling keeps the target distribution (chi-square
//!   on a tiny vocabulary, with two deliberately wrong verifiers failing it),
//!   and end to end through the serve loop;
//! - `faults`: failures injected in a source and in the target forward leave
//!   the model serving correct output.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{Context, Result};

use super::Counts;
use crate::shell;

/// Runs `cargo test ARGS` and counts libtest's passed/failed tests.
fn cargo_test(args: &[&str]) -> Result<Counts> {
    let mut cmd = shell::cargo();
    cmd.arg("test").args(args).stdout(Stdio::piped());
    eprintln!("$ cargo test {}", args.join(" "));
    let mut child = cmd.spawn().context("starting cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    let mut counts = Counts::default();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                if let (Some(label), Some(n)) = (words.next(), words.next().and_then(|n| n.parse::<u64>().ok())) {
                    match label {
                        "passed" => counts.passed += n,
                        "failed" => counts.failed += n,
                        _ => {}
                    }
                }
            }
        }
    }
    if !child.wait()?.success() && counts.failed == 0 {
        counts.failed = 1;
    }
    Ok(counts)
}

pub fn rejection() -> Result<Counts> {
    let mut counts = cargo_test(&["-q", "-p", "serve-loop", "--lib", "verify::"])?;
    counts += cargo_test(&["-q", "-p", "mlx-spec-scenarios", "--test", "serve_loop", "rejection"])?;
    Ok(counts)
}

pub fn faults() -> Result<Counts> {
    cargo_test(&["-q", "-p", "mlx-spec-scenarios", "--test", "providers", "faults"])
}
