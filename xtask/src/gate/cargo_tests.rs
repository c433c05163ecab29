//! Gates that are cargo tests at heart, run here so `cargo xtask gate`
//! covers every check the speculative issue asks of it:
//! - `rejection`: rejection sampling keeps the target distribution (chi-square
//!   on a tiny vocabulary, with two deliberately wrong verifiers failing it),
//!   and end to end through the serve loop;
//! - `faults`: failures injected in a source and in the target forward leave
//!   the model serving correct output; in a `gemma4-assistant` round (draft
//!   step, verify forward, trim) they leave the caches at the last commit and
//!   MLX's active memory where it was; a failing target leaves `suffix`'s
//!   global tree untouched.

use anyhow::Result;

use super::Counts;
use crate::test::{cargo_test as run_counted, Tally};

/// Runs `cargo test ARGS`, counting libtest's passed/failed tests (a run
/// that fails without a failed test, e.g. a build error, counts as one).
fn cargo_test(args: &[&str]) -> Result<Counts> {
    let mut tally = Tally::default();
    let ok = run_counted(args, &mut tally)?;
    let failed = if ok || tally.failed > 0 {
        tally.failed
    } else {
        1
    };
    Ok(Counts {
        passed: tally.passed,
        failed,
    })
}

pub fn rejection() -> Result<Counts> {
    let mut counts = cargo_test(&["-q", "-p", "serve-loop", "--lib", "verify::"])?;
    counts += cargo_test(&[
        "-q",
        "-p",
        "mlx-spec-scenarios",
        "--test",
        "serve_loop",
        "rejection",
    ])?;
    Ok(counts)
}

pub fn faults() -> Result<Counts> {
    let mut counts = cargo_test(&[
        "-q",
        "-p",
        "mlx-spec-scenarios",
        "--test",
        "providers",
        "faults",
    ])?;
    counts += cargo_test(&[
        "-q",
        "-p",
        "mlx-spec-scenarios",
        "--test",
        "gemma4_assistant_faults",
    ])?;
    counts += cargo_test(&[
        "-q",
        "-p",
        "mlx-spec-scenarios",
        "--test",
        "suffix",
        "faults",
    ])?;
    Ok(counts)
}
