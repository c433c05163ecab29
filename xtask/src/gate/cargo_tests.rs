//! Gates that are cargo tests at heart, run here so `cargo xtask gate`
//! covers every check the speculative issue asks of it:
//! - `rejection`: rejection sampling keeps the target distribution (chi-square
//!   on a tiny vocabulary, with two deliberately wrong verifiers failing it),
//!   and end to end through the serve loop, also under a constraint (against
//!   the masked distribution);
//! - `faults`: failures injected in a source and in the target forward leave
//!   the model serving correct output; in a `gemma4-assistant` round (draft
//!   step, verify forward, trim) they leave the caches at the last commit and
//!   MLX's active memory where it was; a failing target leaves `suffix`'s
//!   global tree untouched; a failure mid-chain leaves an EAGLE-3 head and
//!   GLM's MTP row at their last commit.

use anyhow::Result;

use super::Counts;
use crate::test::Tally;

/// Runs `cargo test ARGS`, counting libtest's passed/failed tests (a run
/// that fails without a failed test, e.g. a build error, counts as one).
pub(super) fn cargo_test(args: &[&str]) -> Result<Counts> {
    cargo_test_with_env(args, &[])
}

/// As [`cargo_test`], with environment variables for the tests.
pub(super) fn cargo_test_with_env(
    args: &[&str],
    env: &[(&str, &std::path::Path)],
) -> Result<Counts> {
    let mut tally = Tally::default();
    let ok = crate::test::cargo_test_with_env(args, env, &mut tally)?;
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

/// `cargo test -q` over [`shell::DEBUG_SELECTION`] with `args` (a target
/// and a test-name filter only one package matches), never `-p PACKAGE`:
/// `-p` resolves features for that package alone and builds `mlx-sys`,
/// `mlx-rs` and our crates again (all but 6 s of `rejection`'s 3:25 here,
/// load average 3-4); the shared selection reuses what "cargo test (all
/// targets)" built.
pub(super) fn selected<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["-q"];
    all.extend_from_slice(crate::shell::DEBUG_SELECTION);
    all.extend_from_slice(args);
    all
}

pub fn rejection() -> Result<Counts> {
    let mut counts = cargo_test(&selected(&["--lib", "verify::"]))?;
    counts += cargo_test(&selected(&["--test", "serve_loop", "rejection"]))?;
    counts += cargo_test(&selected(&["--test", "constrained", "rejection"]))?;
    Ok(counts)
}

pub fn faults() -> Result<Counts> {
    let mut counts = cargo_test(&selected(&["--test", "providers", "faults"]))?;
    counts += cargo_test(&selected(&["--test", "gemma4_assistant_faults"]))?;
    counts += cargo_test(&selected(&["--test", "suffix", "faults"]))?;
    // The chained heads' rounds: a failure mid-chain or a commit that
    // cannot apply leaves the head at its last commit (EAGLE-3, GLM's MTP
    // row; every package's `source` target, filtered by name).
    counts += cargo_test(&selected(&[
        "--test",
        "source",
        "misuse_and_failures_leave_the_last_commit",
    ]))?;
    counts += cargo_test(&selected(&[
        "--test",
        "source",
        "a_failure_mid_round_rolls_back_everything_appended",
    ]))?;
    Ok(counts)
}
