//! `prefix-cache`: the in-memory prefix cache is exact. Cargo tests at
//! heart: the cache's lookup rules, trimming, LRU and byte budget
//! (`serve-loop`'s `prefix_cache::` unit tests); split invariance of llama
//! and Gemma-4 (and GLM's lack of it) under arbitrary prefill splits,
//! decoding and verify windows (`tests/tests/split_invariance.rs`); a
//! chat's next turn through one scheduler on tiny llama, Gemma-4 (a
//! sliding window the prefix has rotated) and GLM (plain, prompt lookup,
//! draft-model, the Gemma-4 assistant, GLM's MTP; deepspec in its own
//! crate's `tests/prefix_cache.rs`): after the
//! hit, tokens, log-probabilities (bits), finish and draft counts equal a
//! cold run (`tests/tests/prefix_cache.rs`); then split invariance and the
//! next turn on the real model (SmolLM2-135M-Instruct converted to
//! float32), plain and with prompt lookup.

use anyhow::Result;

use super::cargo_tests::{cargo_test, cargo_test_with_env, selected};
use super::{Counts, Options};
use crate::real_model;

pub fn run(options: &Options) -> Result<Counts> {
    let mut counts = Counts::default();
    if options.tests_ran {
        eprintln!("gate prefix-cache: its tiny-model tests ran in cargo test (all targets)");
    } else {
        // The shared selection, not `-p`: see `cargo_tests.rs`. `--test
        // prefix_cache` is the scenarios' and draft-deepspec's.
        counts += cargo_test(&selected(&["--lib", "prefix_cache::"]))?;
        for test in ["split_invariance", "prefix_cache"] {
            counts += cargo_test(&selected(&["--test", test]))?;
        }
    }
    let real = real_model::ensure()?;
    for test in ["split_invariance", "prefix_cache"] {
        counts += cargo_test_with_env(
            // The shared selection, not `-p mlx-spec-scenarios`: the
            // features "cargo test (all targets)" built the test with (a
            // `-p` selection resolves them for that package alone and builds
            // its dependencies again). draft-deepspec's `prefix_cache` has
            // no ignored `real_model` test: it runs nothing here.
            &selected(&["--test", test, "real_model", "--", "--ignored"]),
            &[("MLX_SPEC_PREFIX_CACHE_MODEL", real.as_path())],
        )?;
    }
    Ok(counts)
}
