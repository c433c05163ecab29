//! `eagle3_trace` (`crates/draft-eagle3/examples/eagle3_trace.rs`): scripted
//! speculative rounds with the `eagle3` source on a target and a head; gate
//! `eagle3`. The reference (`xtask/python/reference_eagle3.py`, SpecForge's
//! EAGLE-3 draft model on torch) replays the rounds from the tensors file
//! (the target's taps) and writes the same [`MtpReport`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::mtp::{MtpReport, MtpSchedule};
use crate::Request;

/// What `eagle3_trace` runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Eagle3Request {
    /// The target checkpoint directory.
    pub target: PathBuf,
    /// The EAGLE-3 head's directory.
    pub head: PathBuf,
    /// The prompt and the scripted rounds.
    pub schedule: MtpSchedule,
    /// Where the target's taps and the head's logits go: a safetensors file
    /// of `taps_prefill` (the prompt's fused features), `pending` (the
    /// first pending token), `taps_{r}` (round r's verified window's) and
    /// `logits_{r}` (round r's draft logits over the draft vocabulary, a
    /// row per draft).
    pub tensors: PathBuf,
}

impl Request for Eagle3Request {
    const BINARY: &'static str = "eagle3_trace";
    type Report = MtpReport;
}
