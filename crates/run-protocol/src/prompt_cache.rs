//! `prompt_cache_run` (`crates/spec-models/examples/prompt_cache_run.rs`):
//! prompt-cache files written for mlx-lm and read from it; gate
//! `prompt-cache`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::greedy::GreedyReport;
use crate::Request;

/// The prefix to cache, the suffix run after it and the greedy steps after
/// the suffix; also the oracle's `--spec` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptCacheSpec {
    /// The cached prompt.
    pub prefix: Vec<u32>,
    /// The prompt's continuation, run from the cache.
    pub suffix: Vec<u32>,
    /// Greedy steps after the suffix.
    pub max_tokens: usize,
    /// The model's keys and values kept quantized (`--kv-bits`), both
    /// sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<crate::KvCacheBits>,
    /// The model's caches bounded to this many positions
    /// (`--max-kv-size`), both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_size: Option<usize>,
}

/// What `prompt_cache_run` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptCacheRequest {
    /// The checkpoint directory (its weights run in the file's dtype, as
    /// mlx-lm runs them).
    pub model: PathBuf,
    /// The prompt and steps.
    pub spec: PromptCacheSpec,
    /// Write a cache file or run from one.
    pub action: PromptCacheAction,
}

/// Write or read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum PromptCacheAction {
    /// Prefill the prefix (mlx-lm's `cache_prompt` schedule) and save the
    /// caches to `file`.
    Write {
        /// The prompt-cache file.
        file: PathBuf,
    },
    /// Run `prefix + suffix` from fresh caches (run 0), `suffix` from
    /// `file`'s caches (run 1) and `suffix` from caches prefilled with the
    /// prefix as for a file, without one (run 2).
    Read {
        /// The prompt-cache file.
        file: PathBuf,
        /// Where the runs' logits go (as [`crate::greedy::ParityRequest::logits`]).
        logits: PathBuf,
    },
}

impl Request for PromptCacheRequest {
    const BINARY: &'static str = "prompt_cache_run";
    type Report = PromptCacheReport;
}

/// What `prompt_cache_run` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum PromptCacheReport {
    /// [`PromptCacheAction::Write`]: the file caches this many tokens.
    Written {
        /// Tokens cached.
        tokens: usize,
    },
    /// [`PromptCacheAction::Read`]: the three runs.
    Ran(GreedyReport),
}
