//! `mtp_trace` (`crates/draft-glm52-mtp/examples/mtp_trace.rs`) and
//! `qwen_mtp_trace` (`crates/draft-qwen3-mtp/examples/qwen_mtp_trace.rs`):
//! scripted speculative rounds with the `glm52-native-mtp` and
//! `qwen3-native-mtp` sources; gate `mtp`. The oracles
//! (`xtask/python/oracle_mtp.py`, `oracle_qwen_mtp.py`) read the same
//! [`MtpSchedule`] and write the same [`MtpReport`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{ExpertOptions, Request};

/// The prompt and the rounds: `(n, k)` drafts `n` tokens and counts the
/// first `min(k, n)` as accepted whatever the target says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpSchedule {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// `(drafted, accepted)` per round.
    pub rounds: Vec<(usize, usize)>,
}

/// What `mtp_trace` runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpRequest {
    /// The checkpoint directory.
    pub model: PathBuf,
    /// The scripted rounds.
    pub schedule: MtpSchedule,
    /// Where the MTP cache goes after each round `r`: a safetensors file of
    /// `latent_{r}`, `rope_{r}` and, where the row has an indexer,
    /// `index_{r}`.
    pub tensors: PathBuf,
    /// Where the target's experts live (default: resident, as stored).
    #[serde(default)]
    pub experts: ExpertOptions,
}

impl Request for MtpRequest {
    const BINARY: &'static str = "mtp_trace";
    type Report = MtpReport;
}

/// What `qwen_mtp_trace` runs: an [`MtpRequest`] on a hybrid Qwen
/// checkpoint, whose tensors file holds `keys_{r}` and `values_{r}` (the
/// MTP layer's cache rows after round `r`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QwenMtpRequest(pub MtpRequest);

impl Request for QwenMtpRequest {
    const BINARY: &'static str = "qwen_mtp_trace";
    type Report = MtpReport;
}

/// Every round's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpReport {
    /// The rounds, in order.
    pub rounds: Vec<MtpRound>,
}

/// One round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtpRound {
    /// The tokens drafted.
    pub drafts: Vec<u32>,
    /// Drafts accepted.
    pub k: usize,
    /// The target's token after them.
    pub next: u32,
    /// The MTP cache's length after the commit.
    pub offset: usize,
}
