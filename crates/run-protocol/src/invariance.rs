//! `invariance_run` (`crates/spec-models/examples/invariance_run.rs`): a
//! row's hidden state and logits alone and inside verify windows, and
//! after a window rolled back; gate `invariance`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Dtype, Request};

/// What `invariance_run` runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvarianceRequest {
    /// The checkpoint directory.
    pub model: PathBuf,
    /// How its weights load.
    pub dtype: Dtype,
    /// Length of the fixed pseudo-random prompt prefilled first.
    pub prompt_len: usize,
    /// Rows decoded after it, one by one and as windows of 2..=rows.
    pub rows: usize,
    /// Where the reference rows go: each row's hidden state then its
    /// logits, float32 little-endian.
    pub bits: PathBuf,
}

impl Request for InvarianceRequest {
    const BINARY: &'static str = "invariance_run";
    type Report = InvarianceReport;
}

/// What `invariance_run` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvarianceReport {
    /// Rows compared.
    pub rows: usize,
    /// Window rows that differ from plain decoding.
    pub mismatches: Vec<WindowRow>,
    /// Windows rolled back to their first row (the caches trimmed), after
    /// which the second row decoded alone was checked against plain
    /// decoding: those whose caches could trim that far.
    pub rollbacks: usize,
    /// The windows of `rollbacks` whose next row then differed.
    pub rolled_back_mismatches: Vec<usize>,
    /// How this process computes float32 GEMMs (`mlx_ext::runtime::info`).
    pub gemm: String,
}

/// Row `row` of the window of `window` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowRow {
    /// The window's size.
    pub window: usize,
    /// The row inside it.
    pub row: usize,
}
