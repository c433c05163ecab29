//! `dspark_trace` (`tests/examples/dspark_trace.rs`): plain
//! and `deepspec` speculative greedy decoding, recording what the drafter
//! saw and did; gate and bench `dspark`. The oracle
//! (`xtask/python/oracle_dspark.py`) replays the saved report (`trace.json`
//! beside the taps) and writes a [`DsparkReplay`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Dtype, Request};

/// What `dspark_trace` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsparkRequest {
    /// The target checkpoint (loaded as float32).
    pub target: PathBuf,
    /// The DSpark drafter checkpoint.
    pub drafter: PathBuf,
    /// How the drafter's weights load.
    pub drafter_dtype: Dtype,
    /// The confidence threshold that cuts a proposal (0: none).
    pub threshold: f32,
    /// Token-id prompts.
    pub prompts: Vec<Vec<u32>>,
    /// Drafts per round (fixed).
    pub num_draft: usize,
    /// Most tokens a run emits.
    pub max_tokens: usize,
    /// Where the target taps go: a safetensors file of `r{i}.prefill` (the
    /// prefill's) and `r{i}.v{j}` (round `j`'s verify window).
    pub taps: PathBuf,
}

impl Request for DsparkRequest {
    const BINARY: &'static str = "dspark_trace";
    type Report = DsparkTrace;
}

/// Every prompt's trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsparkTrace {
    /// One per prompt, in order.
    pub requests: Vec<DsparkRun>,
}

/// One prompt: the speculative run's rounds, both runs' tokens and stats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsparkRun {
    /// The prompt.
    pub prompt: Vec<u32>,
    /// Rows of the prefill taps.
    pub prefill_rows: usize,
    /// The speculative run's rounds.
    pub rounds: Vec<DsparkRound>,
    /// The speculative run's tokens.
    pub tokens: Vec<u32>,
    /// The plain run's tokens.
    pub plain_tokens: Vec<u32>,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Target forwards of the speculative run.
    pub target_calls: usize,
    /// The speculative run's generation time.
    pub generation_seconds: f64,
    /// The plain run's generation time.
    pub plain_seconds: f64,
}

/// One round as the drafter saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsparkRound {
    /// The last token fed (the block's anchor).
    pub anchor: Option<u32>,
    /// Tokens the drafter's context held.
    pub context_len: usize,
    /// Most drafts the round could keep.
    pub max_tokens: usize,
    /// The whole proposed block.
    pub block: Vec<u32>,
    /// The block's confidences, as f32 bits (none without a confidence head).
    pub confidence_bits: Option<Vec<u32>>,
    /// The drafts kept after the cut.
    pub drafts: Vec<u32>,
    /// Drafts the target accepted.
    pub accepted: usize,
    /// Seconds the drafter took to propose the round (its block forward).
    #[serde(default)]
    pub draft_seconds: f64,
}

impl DsparkRound {
    /// What the oracle replays and must equal.
    pub fn proposal(&self) -> Proposal {
        Proposal {
            context_len: self.context_len,
            block: self.block.clone(),
            confidence_bits: self.confidence_bits.clone(),
            drafts: self.drafts.clone(),
        }
    }
}

/// A round's proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proposal {
    /// Tokens the drafter's context held.
    pub context_len: usize,
    /// The whole proposed block.
    pub block: Vec<u32>,
    /// The block's confidences, as f32 bits.
    pub confidence_bits: Option<Vec<u32>>,
    /// The drafts kept after the cut.
    pub drafts: Vec<u32>,
}

/// The oracle's replay: each request's proposals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsparkReplay {
    /// One per prompt.
    pub requests: Vec<ReplayedRun>,
}

/// One prompt's replayed rounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayedRun {
    /// The proposals, round by round.
    pub rounds: Vec<Proposal>,
}
