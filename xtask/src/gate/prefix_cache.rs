//! `prefix-cache`: the in-memory prefix cache is exact. Cargo tests at
//! heart: the cache's lookup rule, trimming, LRU and byte budget
//! (`serve-loop`'s `prefix_cache::` unit tests), and a chat's next turn
//! through one scheduler on tiny llama, Gemma-4 (a sliding window the
//! prefix has rotated) and GLM (plain, prompt lookup, draft-model, the
//! Gemma-4 assistant, GLM's MTP): after the hit, tokens, log-probabilities
//! (bits), finish and draft counts equal a cold run
//! (`tests/tests/prefix_cache.rs`); then the same next turn on the real
//! model (SmolLM2-135M-Instruct converted to float32), plain and with
//! prompt lookup.

use anyhow::Result;

use super::cargo_tests::{cargo_test, cargo_test_with_env};
use super::Counts;
use crate::real_model;

pub fn run() -> Result<Counts> {
    let mut counts = cargo_test(&["-q", "-p", "serve-loop", "--lib", "prefix_cache::"])?;
    counts += cargo_test(&["-q", "-p", "mlx-spec-scenarios", "--test", "prefix_cache"])?;
    let real = real_model::ensure()?;
    counts += cargo_test_with_env(
        &[
            "-q",
            "-p",
            "mlx-spec-scenarios",
            "--test",
            "prefix_cache",
            "real_model",
            "--",
            "--ignored",
        ],
        &[("MLX_SPEC_PREFIX_CACHE_MODEL", real.as_path())],
    )?;
    Ok(counts)
}
