//! `gguf_dequant` (`crates/spec-models/examples/gguf_dequant.rs`): every
//! tensor of a GGUF file as our loader dequantizes it; gate `gguf`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Request;

/// What `gguf_dequant` does: every tensor of a GGUF file dequantized to
/// float32 as our loader does it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GgufRequest {
    /// The GGUF file.
    pub file: PathBuf,
    /// The directory that gets `<tensor name>.f32` (little-endian,
    /// row-major).
    pub out: PathBuf,
}

impl Request for GgufRequest {
    const BINARY: &'static str = "gguf_dequant";
    type Report = GgufReport;
}

/// The tensors written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GgufReport {
    /// Their names, in the file's order.
    pub tensors: Vec<String>,
}
