//! `assistant_step` and `assistant_round`
//! (`crates/draft-gemma4-assistant/examples/`): the Gemma-4 assistant
//! drafter's step on random inputs and one round after a prefill; gate
//! `assistant`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Request;

/// What `assistant_step` runs: `cases` drafter steps on random inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRequest {
    /// The assistant checkpoint.
    pub assistant: PathBuf,
    /// Steps (each its own position, donor lengths and key heads).
    pub cases: usize,
    /// Where the inputs it drew go (safetensors: `emb.i`, `hidden.i`,
    /// `sk.i`, `sv.i`, `fk.i`, `fv.i`, `pos.i`).
    pub inputs: PathBuf,
    /// Where its outputs go (safetensors: `logits.i`, `next_hidden.i`).
    pub outputs: PathBuf,
}

impl Request for StepRequest {
    const BINARY: &'static str = "assistant_step";
    type Report = StepReport;
}

/// What `assistant_step` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepReport {
    /// Steps run.
    pub cases: usize,
}

/// Where the drafter's query sits (`PositionMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// Every step at the anchor's position.
    Constant,
    /// One position further per step.
    Advancing,
    /// One further per step, from the last cached position.
    AdvancingFromLastCached,
}

/// What `assistant_round` runs: for each prompt a full prefill, then one
/// round of `steps` drafts from its greedy pending token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundRequest {
    /// The Gemma-4 target checkpoint.
    pub target: PathBuf,
    /// The assistant checkpoint.
    pub assistant: PathBuf,
    /// Token-id prompts.
    pub prompts: Vec<Vec<u32>>,
    /// Drafts per round.
    pub steps: usize,
    /// The query positions.
    pub positions: Positions,
}

impl Request for RoundRequest {
    const BINARY: &'static str = "assistant_round";
    type Report = Rounds;
}

/// One round per prompt; transformers' reference
/// (`xtask/python/reference_assistant.py`) writes the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rounds {
    /// In prompt order.
    pub rounds: Vec<Round>,
}

/// One round after a prefill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Round {
    /// The pending token drafted from.
    pub pending: u32,
    /// The reference's own greedy pending token (it drafts from ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pending: Option<u32>,
    /// The anchor: the target's post-norm hidden at the last position.
    pub hidden: Vec<f32>,
    /// The drafts.
    pub tokens: Vec<u32>,
    /// Each step's logits.
    pub logits: Vec<Vec<f32>>,
    /// The reference's drafts over the prefill's uncut sliding donor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_tokens: Vec<u32>,
}
