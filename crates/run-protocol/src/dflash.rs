//! `dflash_trace` (`tests/examples/dflash_trace.rs`): plain and
//! `dflash` speculative greedy decoding, recording what the drafter saw and
//! did; gate `dflash`. The report is the DSpark trace's form (a block per
//! round, no confidences, every block's tokens kept as drafts); the oracle
//! (`xtask/python/oracle_dflash.py`, z-lab's `model_mlx.py`) replays it and
//! writes a [`crate::dspark::DsparkReplay`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::dspark::DsparkTrace;
use crate::Request;

/// What `dflash_trace` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DflashRequest {
    /// The target checkpoint (loaded as float32).
    pub target: PathBuf,
    /// The DFlash drafter checkpoint (loaded as float32).
    pub drafter: PathBuf,
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

impl Request for DflashRequest {
    const BINARY: &'static str = "dflash_trace";
    type Report = DsparkTrace;
}
