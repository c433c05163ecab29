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
    /// Where the file is also written as mlx-lm directories, loaded as the
    /// engine loads it: `EXPORT/keep` (the file's own quantization) and
    /// `EXPORT/float32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<PathBuf>,
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

/// What `gguf_vocab` (`crates/spec-text/examples/gguf_vocab.rs`) does: each
/// GGUF file's tokenizer, built from its metadata, encodes texts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GgufVocabRequest {
    /// The files and their texts.
    pub cases: Vec<VocabCase>,
}

/// One GGUF file (its tensors need not exist: llama.cpp's vocabulary files
/// hold only metadata) and the texts to encode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VocabCase {
    /// The GGUF file.
    pub file: PathBuf,
    /// Texts encoded without special tokens added.
    pub texts: Vec<String>,
    /// Where the tokenizer is written as Hugging Face files
    /// (`tokenizer.json`, `tokenizer_config.json`: what `mlx-spec convert`
    /// writes beside a converted model), if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_dir: Option<PathBuf>,
}

impl Request for GgufVocabRequest {
    const BINARY: &'static str = "gguf_vocab";
    type Report = GgufVocabReport;
}

/// Each case's ids, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GgufVocabReport {
    /// One entry per case.
    pub cases: Vec<VocabResult>,
}

/// The ids of each text, or why the tokenizer could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VocabResult {
    /// The ids of each text, without special tokens added.
    pub ids: Vec<Vec<u32>>,
    /// Those ids decoded again, whole, and token by token through the
    /// streaming decoder (the pieces joined).
    pub decoded: Vec<String>,
    /// The streaming decoder's pieces joined, per text.
    pub streamed: Vec<String>,
    /// The error that kept the tokenizer from being built, if any.
    pub error: Option<String>,
}
