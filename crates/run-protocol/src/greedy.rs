//! `parity_run` (`crates/spec-models/examples/parity_run.rs`): greedy
//! continuations and the logits of every step, with mlx-lm's
//! `generate_step` schedule; gates `parity`, `reference` and `quantize`.
//! [`GreedyReport`] is also what the oracles of those gates and of
//! `prompt-cache` write.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Dtype, KvCacheBits, Request};

/// What `parity_run` runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParityRequest {
    /// The checkpoint directory.
    pub model: PathBuf,
    /// How its weights load.
    pub dtype: Dtype,
    /// Token-id prompts, each run greedily.
    pub prompts: Vec<Vec<u32>>,
    /// Greedy steps per prompt.
    pub max_tokens: usize,
    /// Where the logits go: a safetensors file of float32 `logits_{i}`,
    /// `[max_tokens, vocab]`, row `s` the logits that chose token `s`.
    pub logits: PathBuf,
    /// Keys and values kept quantized (`--kv-bits`); `None`: float.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheBits>,
    /// A fine-tuned adapter directory applied at load (`--adapter-path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<PathBuf>,
}

impl Request for ParityRequest {
    const BINARY: &'static str = "parity_run";
    type Report = GreedyReport;
}

/// Greedy runs' tokens, one run per prompt (`{"runs": [{"tokens": [..]}]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GreedyReport {
    /// The runs, in prompt order.
    pub runs: Vec<TokenRun>,
}

/// One greedy run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRun {
    /// The tokens chosen.
    pub tokens: Vec<u32>,
}

impl GreedyReport {
    /// The runs' tokens.
    pub fn tokens(self) -> Vec<Vec<u32>> {
        self.runs.into_iter().map(|r| r.tokens).collect()
    }
}
