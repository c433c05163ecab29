//! `mtp_trace` (`crates/draft-glm52-mtp/examples/mtp_trace.rs`): scripted
//! speculative rounds with the `glm52-native-mtp` source; gate `mtp`. The
//! oracle (`xtask/python/oracle_mtp.py`) reads the same [`MtpSchedule`] and
//! writes the same [`MtpReport`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Request;

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
    /// The GLM checkpoint directory.
    pub model: PathBuf,
    /// The scripted rounds.
    pub schedule: MtpSchedule,
    /// Where the MTP cache goes after each round `r`: a safetensors file of
    /// `latent_{r}`, `rope_{r}` and, where the row has an indexer,
    /// `index_{r}`.
    pub tensors: PathBuf,
}

impl Request for MtpRequest {
    const BINARY: &'static str = "mtp_trace";
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
