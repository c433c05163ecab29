//! `parity_run` (`crates/spec-models/examples/parity_run.rs`): greedy
//! continuations and the logits of every step, with mlx-lm's
//! `generate_step` schedule; gates `parity`, `reference` and `quantize`.
//! [`GreedyReport`] is also what the oracles of those gates and of
//! `prompt-cache` write.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Dtype, KvCacheBits, Request};

/// What `parity_run` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Caches bounded to this many positions, the first four kept
    /// (`--max-kv-size`); `None`: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_size: Option<usize>,
    /// Logits processors applied before each greedy choice, and a sampler
    /// whose distribution each step reports; `None`: neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoding: Option<Decoding>,
}

/// mlx-lm's logits processors (`make_logits_processors`) and sampler
/// (`make_sampler`) settings, the same on both sides of a parity run. The
/// processors change the logits the greedy choice and the recorded
/// `logits_{i}` see; the sampler's distribution over each step's
/// log-probabilities is recorded as float32 `probs_{i}` [max_tokens, vocab].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decoding {
    /// `(token id, bias)` pairs.
    pub logit_bias: Vec<(u32, f32)>,
    /// `(amount, context)` of mlx-lm's repetition penalty.
    pub repetition: Option<(f32, usize)>,
    /// `(amount, context)` of its presence penalty.
    pub presence: Option<(f32, usize)>,
    /// `(amount, context)` of its frequency penalty.
    pub frequency: Option<(f32, usize)>,
    /// The sampler's temperature (above 0).
    pub temperature: f32,
    /// Nucleus threshold (0 or 1: off).
    pub top_p: f32,
    /// Min-p threshold (0: off).
    pub min_p: f32,
    /// Tokens min-p keeps whatever their probability.
    pub min_tokens_to_keep: usize,
    /// Top-k (0: off).
    pub top_k: usize,
    /// XTC's chance (0: off; 1: the cut every step, deterministic).
    pub xtc_probability: f32,
    /// XTC's threshold.
    pub xtc_threshold: f32,
    /// Tokens XTC never removes.
    pub xtc_special_tokens: Vec<u32>,
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
