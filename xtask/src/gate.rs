//! `cargo xtask gate [NAME...] [--model DIR]...`: checks of our engine against
//! installed reference implementations (the oracles of `docs/TESTING.md`
//! and "Oracles" in `docs/ARCHITECTURE.md`), each gate counting models
//! that pass. [`GATES`] lists them, with what each checks, once.

mod assistant;
mod batch;
mod cargo_tests;
mod compare;
mod dflash;
pub mod distributed;
mod distributed_serve;
mod draft_parity;
pub mod dspark;
mod eagle3;
mod gguf;
mod gguf_convert;
mod gguf_vocab;
mod invariance;
mod llama_cpp;
mod lossless;
mod mtp;
mod parity;
mod perplexity;
mod prefix_cache;
mod prompt_cache;
mod quantize;
mod reference;
mod server;
mod structured;
mod suffix;
pub mod suite;

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::prereqs;
use crate::timing::Timings;

/// A gate: its name, what it checks, and how it runs.
#[derive(Debug, Clone, Copy)]
pub struct Gate {
    pub name: &'static str,
    /// One line, for `cargo xtask help`.
    pub checks: &'static str,
    run: fn(&Options) -> Result<Counts>,
}

/// Every gate, in the order `cargo xtask gate` runs them.
pub const GATES: &[Gate] = &[
    Gate {
        name: "invariance",
        checks: "a row's hidden state and logits are bit-identical alone, inside verify windows of up to 33 rows, and with 1 or 2 BLAS threads",
        run: |_| invariance::run(),
    },
    Gate {
        name: "parity",
        checks: "our target-model runtime against mlx-lm, token for token (--model DIR adds a real mlx-lm checkpoint)",
        run: parity::run,
    },
    Gate {
        name: "gguf",
        checks: "every ggml type our GGUF loader reads dequantizes to the bits of `gguf.quants.dequantize`; tokenizers from GGUF metadata give Hugging Face's ids on llama.cpp's vocabulary tests",
        run: |_| gguf::run(),
    },
    Gate {
        name: "lossless",
        checks: "every provider's speculative greedy output equals plain greedy output on the prompt suite",
        run: |_| lossless::run(),
    },
    Gate {
        name: "batch",
        checks: "requests run together through one scheduler (mixed providers, staggered arrivals, cancellations) give what they give alone",
        run: |_| batch::run(),
    },
    Gate {
        name: "draft-parity",
        checks: "the `draft-model` provider against mlx-lm's speculative decoding",
        run: |_| draft_parity::run(),
    },
    Gate {
        name: "mtp",
        checks: "the `glm52-native-mtp` and `qwen3-native-mtp` providers' drafts and caches against project-written oracles, bit for bit",
        run: |_| mtp::run(),
    },
    Gate {
        name: "structured",
        checks: "constrained decoding (JSON schemas, a Lark grammar, a regex) against mlx-lm driven by llguidance, the same with forced-token drafts and every provider, answers valid (`jsonschema`)",
        run: |_| structured::run(),
    },
    Gate {
        name: "rejection",
        checks: "the statistical checks of rejection sampling (cargo tests, see `cargo_tests.rs`)",
        run: |options| unless_tested("rejection", options, cargo_tests::rejection),
    },
    Gate {
        name: "faults",
        checks: "the fault-injection checks (cargo tests, see `cargo_tests.rs`)",
        run: |options| unless_tested("faults", options, cargo_tests::faults),
    },
    Gate {
        name: "server",
        checks: "the server with the `openai` client and schemathesis, then an agent loop (tool calls and results, both APIs) with the `openai` and `anthropic` clients",
        run: |_| server::run(),
    },
    Gate {
        name: "dspark",
        checks: "the `deepspec` provider against our DSpark oracle, and lossless",
        run: |_| dspark::run(),
    },
    Gate {
        name: "dflash",
        checks: "the `dflash` provider against z-lab's `model_mlx.py` drafter, and lossless",
        run: |_| dflash::run(),
    },
    Gate {
        name: "quantize",
        checks: "`mlx-spec quantize` equals `mx.quantize` bit for bit and writes what `mlx_lm.convert -q` writes; mlx-lm and our engine load it",
        run: |_| quantize::run(),
    },
    Gate {
        name: "perplexity",
        checks: "`mlx-spec perplexity` against mlx-lm's `eval_ppl` on the same rows (mlx-lm's dataset formats, numpy's record order)",
        run: |_| perplexity::run(),
    },
    Gate {
        name: "assistant",
        checks: "the `gemma4-assistant` provider against optiq's `spec_generate` and drafter step, and its constant-position drafts against transformers' candidate generator",
        run: |_| assistant::run(),
    },
    Gate {
        name: "prompt-cache",
        checks: "our prompt-cache files against mlx-lm's, both directions, the same next-token logits as a cold prefill",
        run: |_| prompt_cache::run(),
    },
    Gate {
        name: "distributed",
        checks: "pipelines of 2 and 3 local ranks give the single process's tokens, plainly and with each provider; a pipelined server batches concurrent requests and answers each as one process does",
        run: |_| distributed::run(),
    },
    Gate {
        name: "prefix-cache",
        checks: "a request from the in-memory prefix cache equals the same request cold, bit for bit (cargo tests, see `prefix_cache.rs`)",
        run: prefix_cache::run,
    },
    Gate {
        name: "reference",
        checks: "our runtime against transformers (the model publishers' reference code, torch on CPU) on checkpoints transformers saved",
        run: |_| reference::run(),
    },
    Gate {
        name: "eagle3",
        checks: "the `eagle3` provider's drafts and logits against SpecForge's EAGLE-3 draft model (torch, CPU)",
        run: |_| eagle3::run(),
    },
    Gate {
        name: "suffix",
        checks: "the `suffix` provider against arctic-inference's suffix tree and `SuffixDecodingCache`",
        run: |_| suffix::run(),
    },
];

/// Every gate's name, in [`GATES`]' order.
pub fn names() -> Vec<&'static str> {
    GATES.iter().map(|g| g.name).collect()
}

/// The gate called `name`.
fn find(name: &str) -> Result<&'static Gate> {
    match GATES.iter().find(|g| g.name == name) {
        Some(g) => Ok(g),
        None => bail!("unknown gate `{name}` (known: {})", names().join(", ")),
    }
}

/// A gate that is cargo tests at heart: nothing to do once every test
/// target ran in this invocation ([`Options::tests_ran`]).
fn unless_tested(name: &str, options: &Options, tests: fn() -> Result<Counts>) -> Result<Counts> {
    if options.tests_ran {
        eprintln!("gate {name}: its tests ran in cargo test (all targets)");
        return Ok(Counts::default());
    }
    tests()
}

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

impl Counts {
    /// Counts one check, passed or failed.
    pub fn count(&mut self, passed: bool) {
        if passed {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
    }
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
    (find(name)?.run)(options)
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
            name => names.push(find(name)?.name),
        }
    }
    if names.is_empty() {
        names = self::names();
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
        assert_eq!(names, self::names());
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
    fn gate_names_are_unique() {
        let mut names = names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), GATES.len());
    }

    #[test]
    fn unknown_gates_and_flags_are_errors() {
        assert!(parse(&args(&["nope"])).is_err());
        assert!(parse(&args(&["--fast"])).is_err());
        assert!(parse(&args(&["--model"])).is_err());
    }
}
