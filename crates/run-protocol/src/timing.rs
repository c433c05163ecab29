//! The timing binaries of the benches: `batch_time` (`bench
//! batch-forward`) and `window_time` (`bench decode`), both in
//! `crates/spec-models/examples/`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Request;

/// Every row's window length in a `batch_time` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Windows {
    /// Every row this many tokens.
    Each(usize),
    /// Each row its own length, as prompt lookup's verify windows of 1 +
    /// 0..16 drafts (`batch_time`'s `MIXED`, in turn).
    Mixed,
}

impl std::fmt::Display for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Windows::Each(n) => write!(f, "{n}"),
            Windows::Mixed => f.write_str("mixed"),
        }
    }
}

/// What `batch_time` times: `Target::forward_batch` against the same rows
/// one after another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchTimeRequest {
    /// The checkpoint directory.
    pub model: PathBuf,
    /// Rows per step.
    pub rows: Vec<usize>,
    /// Window lengths per step.
    pub windows: Vec<Windows>,
    /// Each row's prefill length (plus its index).
    pub offset: usize,
    /// Timed steps per shape (after one warm-up).
    pub repeats: usize,
    /// Keys and values kept quantized (`--kv-bits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<crate::KvCacheBits>,
}

impl Request for BatchTimeRequest {
    const BINARY: &'static str = "batch_time";
    type Report = BatchTimeReport;
}

/// One time per step shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchTimeReport {
    /// In request order: rows, then windows.
    pub steps: Vec<BatchStep>,
}

/// One step shape's times, in ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchStep {
    /// Rows.
    pub rows: usize,
    /// Their windows.
    pub windows: Windows,
    /// Median packed step.
    pub packed_ms: f64,
    /// Median of the rows one by one.
    pub alone_ms: f64,
    /// Fastest packed step.
    pub packed_min_ms: f64,
    /// Fastest one-by-one step.
    pub alone_min_ms: f64,
}

/// What `window_time` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum WindowTimeRequest {
    /// Only say how this process computes float32 GEMMs.
    Describe,
    /// Time `Target::decode` over windows of each size after a prompt.
    Time {
        /// The checkpoint directory.
        model: PathBuf,
        /// The prompt's length.
        prompt_len: usize,
        /// Window sizes.
        rows: Vec<usize>,
        /// Timed runs per size (after one warm-up).
        repeats: usize,
    },
}

impl Request for WindowTimeRequest {
    const BINARY: &'static str = "window_time";
    type Report = WindowTimeReport;
}

/// The GEMM path and the window times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowTimeReport {
    /// How this process computes float32 GEMMs (`mlx_ext::runtime::info`).
    pub gemm: String,
    /// Median time per window size (empty for [`WindowTimeRequest::Describe`]).
    pub windows: Vec<WindowTime>,
}

/// One window size's median time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowTime {
    /// Rows in the window.
    pub rows: usize,
    /// Median ms.
    pub ms: f64,
    /// Median microseconds of rolling the window back (`CacheSet::trim`).
    pub trim_us: f64,
    /// Bytes the window's rows added to the caches (keys and values, a
    /// recurrent layer's states per position), measured before the trim.
    pub added_bytes: usize,
}
