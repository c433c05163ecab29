//! `cargo xtask gate [NAME...] [--model DIR]...`: checks of our engine against
//! installed reference implementations (the oracles of `docs/TESTING.md`
//! and "Oracles" in `docs/ARCHITECTURE.md`), each gate counting models
//! that pass.
//!
//! - `invariance`: a row's hidden state and logits are bit-identical alone,
//!   inside verify windows of up to 33 rows, and with 1 or 2 BLAS threads.
//! - `parity`: our target-model runtime against mlx-lm, token for token.
//! - `gguf`: every ggml type our GGUF loader reads dequantizes to the bits
//!   of `gguf.quants.dequantize`.
//! - `lossless`: every provider's speculative greedy output equals plain
//!   greedy output on the prompt suite.
//! - `draft-parity`: the `draft-model` provider against mlx-lm's
//!   speculative decoding.
//! - `mtp`: the `glm52-native-mtp` provider's drafts and MTP cache against
//!   a project-written oracle, bit for bit.
//! - `rejection`, `faults`: the statistical and fault-injection checks (cargo
//!   tests, see `cargo_tests.rs`).
//! - `server`: the OpenAI-compatible server with the `openai` client and
//!   schemathesis.
//! - `dspark`: the `deepspec` provider against our DSpark oracle, and lossless.
//! - `quantize`: `mlx-spec quantize` equals `mx.quantize` bit for bit and
//!   writes what `mlx_lm.convert -q` writes; mlx-lm and our engine load it.
//! - `assistant`: the `gemma4-assistant` provider against optiq's
//!   `spec_generate` and drafter step, and its constant-position drafts
//!   against transformers' candidate generator.
//! - `prompt-cache`: our prompt-cache files against mlx-lm's, both
//!   directions, the same next-token logits as a cold prefill.
//! - `prefix-cache`: a request from the in-memory prefix cache equals the
//!   same request cold, bit for bit (cargo tests, see `prefix_cache.rs`).
//! - `batch`: requests run together through one scheduler (mixed providers,
//!   staggered arrivals, cancellations) give what they give alone.
//! - `distributed`: pipelines of 2 and 3 local ranks give the single
//!   process's tokens, plainly and with each provider; a pipelined server
//!   batches concurrent requests and answers each as one process does.
//! - `reference`: our runtime against transformers (the model publishers'
//!   reference code, torch on CPU) on checkpoints transformers saved.
//! - `suffix`: the `suffix` provider against arctic-inference's suffix tree
//!   and `SuffixDecodingCache`.

mod assistant;
mod batch;
mod cargo_tests;
pub mod distributed;
mod distributed_serve;
mod draft_parity;
pub mod dspark;
mod gguf;
mod invariance;
mod lossless;
mod mtp;
mod parity;
mod prefix_cache;
mod prompt_cache;
mod quantize;
mod reference;
mod server;
mod suffix;
pub mod suite;

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::prereqs;
use crate::timing::Timings;

/// Every gate, in the order `cargo xtask gate` runs them.
pub const ALL: &[&str] = &[
    "invariance",
    "parity",
    "gguf",
    "lossless",
    "batch",
    "draft-parity",
    "mtp",
    "rejection",
    "faults",
    "server",
    "dspark",
    "quantize",
    "assistant",
    "prompt-cache",
    "distributed",
    "prefix-cache",
    "reference",
    "suffix",
];

/// What the gates take besides their names.
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// Real checkpoints (mlx-lm layout) the parity gate checks besides the
    /// synthetic ones.
    pub models: Vec<PathBuf>,
    /// Every test target already ran in this invocation (`cargo xtask
    /// test`, in "cargo test (all targets)", the same debug profile): the
    /// gates that are those tests again (`rejection`, `faults`, the
    /// non-ignored tests of `prefix-cache`) do not run them a second time.
    pub tests_ran: bool,
}

/// Models (or other units a gate checks) that passed and failed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let (names, options) = parse(args)?;
    prereqs::ensure()?;
    let mut timings = Timings::default();
    let counts = check(&names, &options, &mut timings);
    eprintln!("\ntime per gate:\n{}", timings.render());
    if counts.failed > 0 {
        bail!(
            "gate failed: {} of {} checks",
            counts.failed,
            counts.failed + counts.passed
        );
    }
    Ok(())
}

/// Runs the named gates; failures of individual models are counted, and a
/// gate that cannot run at all (its error printed) counts as one failure
/// while the gates after it still run. Each gate's wall-clock time goes to
/// `timings`.
pub fn check(names: &[&str], options: &Options, timings: &mut Timings) -> Counts {
    let mut counts = Counts::default();
    for name in names {
        // A gate that cannot run counts as one failure; the others still run.
        match timings.time(&format!("gate {name}"), || one(name, options)) {
            Ok(c) => counts += c,
            Err(e) => {
                eprintln!("gate {name} could not run: {e:#}");
                counts.failed += 1;
            }
        }
    }
    counts
}

fn one(name: &str, options: &Options) -> Result<Counts> {
    Ok(match name {
        "invariance" => invariance::run()?,
        "parity" => parity::run(options)?,
        "gguf" => gguf::run()?,
        "lossless" => lossless::run()?,
        "batch" => batch::run()?,
        "draft-parity" => draft_parity::run()?,
        "mtp" => mtp::run()?,
        "rejection" | "faults" if options.tests_ran => {
            eprintln!("gate {name}: its tests ran in cargo test (all targets)");
            Counts::default()
        }
        "rejection" => cargo_tests::rejection()?,
        "faults" => cargo_tests::faults()?,
        "server" => server::run()?,
        "dspark" => dspark::run()?,
        "quantize" => quantize::run()?,
        "assistant" => assistant::run()?,
        "prompt-cache" => prompt_cache::run()?,
        "distributed" => distributed::run()?,
        "prefix-cache" => prefix_cache::run(options)?,
        "reference" => reference::run()?,
        "suffix" => suffix::run()?,
        other => bail!("unknown gate `{other}` (known: {})", ALL.join(", ")),
    })
}

fn parse(args: &[String]) -> Result<(Vec<&str>, Options)> {
    let mut names = Vec::new();
    let mut options = Options::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--model" => match it.next() {
                Some(dir) => options.models.push(PathBuf::from(dir)),
                None => bail!("--model needs a directory"),
            },
            flag if flag.starts_with('-') => {
                bail!("unknown flag `{flag}`\nusage: cargo xtask gate [NAME...] [--model DIR]...")
            }
            name => match ALL.iter().find(|g| **g == name) {
                Some(g) => names.push(*g),
                None => bail!("unknown gate `{name}` (known: {})", ALL.join(", ")),
            },
        }
    }
    if names.is_empty() {
        names = ALL.to_vec();
    }
    Ok((names, options))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn no_names_means_every_gate() {
        let a = args(&[]);
        let (names, options) = parse(&a).expect("parse");
        assert_eq!(names, ALL);
        assert!(options.models.is_empty());
    }

    #[test]
    fn models_and_names_parse_in_any_order() {
        let a = args(&["--model", "/m/a", "parity", "--model", "/m/b"]);
        let (names, options) = parse(&a).expect("parse");
        assert_eq!(names, ["parity"]);
        assert_eq!(
            options.models,
            [PathBuf::from("/m/a"), PathBuf::from("/m/b")]
        );
    }

    #[test]
    fn gates_run_alone_run_their_tests() {
        let (_, options) = parse(&args(&["rejection"])).expect("parse");
        assert!(!options.tests_ran);
    }

    #[test]
    fn after_the_test_targets_the_cargo_test_gates_do_not_run_them_again() {
        let options = Options {
            tests_ran: true,
            ..Options::default()
        };
        for name in ["rejection", "faults"] {
            assert_eq!(one(name, &options).expect(name), Counts::default());
        }
    }

    #[test]
    fn unknown_gates_and_flags_are_errors() {
        assert!(parse(&args(&["nope"])).is_err());
        assert!(parse(&args(&["--fast"])).is_err());
        assert!(parse(&args(&["--model"])).is_err());
    }
}
