//! `cargo xtask test`: everything CI checks. It starts with `cargo fmt --check`
//! and the build with clippy's lints (`-D warnings`), runs every test binary, then every gate
//! (each gate model counts as one test), and closes with the time of each
//! step and one summary line (`summary: N passed, M failed`).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{bail, Context, Result};

use crate::timing::Timings;
use crate::{gate, prereqs, shell, venv};

pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask test` takes no arguments");
    }
    let mut clock = Timings::default();
    clock.time("prerequisites", || {
        prereqs::ensure()?;
        prereqs::ensure_lint_tools()
    })?;
    let mut tally = Tally::default();
    // Formatting first: it takes seconds and fails the most often.
    let fmt = clock.time("cargo fmt --check", || {
        shell::run(shell::cargo().args(FMT)).is_ok()
    });
    tally.count(fmt);
    if !fmt {
        eprintln!("cargo fmt --check failed: run `cargo fmt --all` to fix it");
    }
    // Then every binary and example (gates and scenario tests run them from
    // target/debug/), built through `clippy-driver` with `-D warnings`: the
    // build is the lint (`shell::cargo`). A lint or build failure stops here:
    // every later step would fail on it again.
    if shell::clippy_driver().is_none() {
        bail!("clippy-driver is missing beside cargo (`rustup component add clippy`)");
    }
    let built = clock.time("build + cargo clippy -D warnings", || {
        shell::run(shell::cargo().args(shell::build_args()))
    });
    tally.count(built.is_ok());
    if let Err(e) = built {
        println!("\ntime per step:\n{}", clock.render());
        println!("summary: {} passed, {} failed", tally.passed, tally.failed);
        bail!("{e:#}: clippy's lints (`-D warnings`) or the build failed, see above");
    }
    let doc = clock.time("cargo test --doc", || {
        cargo_test(&[shell::DEBUG_SELECTION, &["--doc"]].concat(), &mut tally)
    })?;
    let all = clock.time("cargo test (all targets)", || {
        let workspace = cargo_test(
            &[shell::DEBUG_SELECTION, &["--all-targets", "--no-fail-fast"]].concat(),
            &mut tally,
        )?;
        // `xtask`'s own tests (the repository's text: `tidy.rs`), in the
        // selection `cargo xtask` was built with.
        Ok::<bool, anyhow::Error>(
            cargo_test(&["-p", "xtask", "--no-fail-fast"], &mut tally)? && workspace,
        )
    })?;
    // What the gates share, timed apart from them: the oracle environment
    // (the gates run the debug build of every binary and example, built
    // above).
    let setup = clock.time("python environment (oracles)", || venv::ensure().map(drop));
    if let Err(e) = &setup {
        eprintln!("gate setup failed: {e:#}");
        tally.failed += 1;
    }
    // The reference environment (torch, transformers) of gate `reference`:
    // installed once per machine, outside the clone.
    if let Err(e) = clock.time("python environment (reference)", || {
        crate::reference_env::ensure().map(drop)
    }) {
        eprintln!("reference environment setup failed: {e:#}");
        tally.failed += 1;
    }
    // A gate that cannot run at all (no venv, say) counts as one failure and
    // the other gates still run, so the summary still comes last.
    let mut gate_clock = Timings::default();
    // The gates that are cargo tests at heart skip what "cargo test (all
    // targets)" just ran (`gate::Options::tests_ran`).
    let options = gate::Options {
        tests_ran: true,
        ..gate::Options::default()
    };
    let counts = gate::check(&gate::names(), &options, &mut gate_clock);
    tally.passed += counts.passed;
    tally.failed += counts.failed;
    clock.extend(gate_clock);
    // A short fuzz smoke of each weights-file parser, where a nightly
    // toolchain and cargo-fuzz exist (the stable smoke-fuzz test ran above
    // regardless).
    match crate::fuzz::smoke_unavailable() {
        None => match clock.time("fuzz smoke", || crate::fuzz::fuzz(10, None)) {
            Ok(counts) => {
                tally.passed += counts.passed;
                tally.failed += counts.failed;
            }
            Err(e) => {
                eprintln!("fuzz smoke could not run: {e:#}");
                tally.failed += 1;
            }
        },
        Some(why) => eprintln!("fuzz smoke skipped: {why}"),
    }
    println!("\ntime per step:\n{}", clock.render());
    println!("summary: {} passed, {} failed", tally.passed, tally.failed);
    if !(doc && all) || tally.failed > 0 {
        bail!("tests failed");
    }
    if tally.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// The format check, as cargo arguments (`rustfmt.toml` holds the line
/// width). Clippy runs inside the build (`shell::cargo`).
const FMT: &[&str] = &["fmt", "--all", "--check"];

#[derive(Default)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
}

impl Tally {
    fn count(&mut self, ok: bool) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
    }

    /// Reads libtest's `test result: ok. 8 passed; 0 failed; ...` lines.
    fn read(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(count)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(count) = count.parse::<u64>() else {
                continue;
            };
            match label {
                "passed" => self.passed += count,
                "failed" => self.failed += count,
                _ => {}
            }
        }
    }
}

/// Runs `cargo test ARGS`, echoing its output; returns whether it succeeded.
pub fn cargo_test(args: &[&str], tally: &mut Tally) -> Result<bool> {
    cargo_test_with_env(args, &[], tally)
}

/// As [`cargo_test`], with environment variables for the tests.
pub fn cargo_test_with_env(
    args: &[&str],
    env: &[(&str, &std::path::Path)],
    tally: &mut Tally,
) -> Result<bool> {
    let mut cmd = shell::cargo();
    cmd.arg("test").args(args).stdout(Stdio::piped());
    for (key, value) in env {
        cmd.env(key, value);
    }
    eprintln!("$ cargo test {}", args.join(" "));
    let mut child = cmd.spawn().context("starting cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        tally.read(&line);
    }
    Ok(child.wait().context("waiting for cargo test")?.success())
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn tally_reads_libtest_result_lines() {
        let mut t = Tally::default();
        t.read("test result: ok. 8 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s");
        t.read("test result: FAILED. 3 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out");
        t.read("test something ... ok");
        assert_eq!((t.passed, t.failed), (11, 2));
    }
}
