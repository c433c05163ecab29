//! Validates weights files before MLX reads them. MLX's own loaders trust the
//! header of a safetensors or GGUF file; a corrupt or malicious one can make
//! them crash or allocate what the header claims. Every file goes through
//! [`check_model_file`] (or [`check_safetensors`] / [`check_gguf`]) first, so
//! such a file yields a specific [`GuardError`] instead.
//!
//! Only headers are read: the data section is never read or allocated, its
//! extent is compared with the file's length. Every count a header claims is
//! checked against [`Limits`] and against the bytes left in the file before
//! anything is allocated for it, so a 1 KiB file claiming 2^60 tensors is
//! refused at once. Pickle checkpoints (`.bin`, `.pt`, `.pth`, `.pkl`,
//! `.ckpt`) are refused outright ([`refuse_pickle`]): loading one can run
//! arbitrary code.
//!
//! ```no_run
//! use std::path::Path;
//!
//! let summary = weights_guard::check_model_file(Path::new("model.safetensors"))?;
//! println!("{} tensors", summary.tensor_count());
//! # Ok::<(), weights_guard::GuardError>(())
//! ```
#![warn(missing_docs)]

mod error;
mod ggml_type;
mod gguf_file;
mod gguf_value;
mod limits;
mod safetensors_file;
mod safetensors_json;

use std::path::Path;

pub use error::GuardError;
pub use ggml_type::GgmlType;
pub use gguf_file::{
    check_gguf, check_gguf_bytes, check_gguf_reader, read_gguf, read_gguf_bytes, GgufSummary,
    GgufTensor,
};
pub use gguf_value::{GgufMetadata, GgufValue};
pub use limits::Limits;
pub use safetensors_file::{
    check_safetensors, check_safetensors_bytes, SafetensorsDtype, SafetensorsSummary,
    SafetensorsTensor,
};

/// The path errors name when the input was a byte slice.
const MEMORY: &str = "<memory>";

/// Extensions of pickle-based checkpoints, which are never loaded.
pub const PICKLE_EXTENSIONS: [&str; 5] = ["bin", "pt", "pth", "pkl", "ckpt"];

/// The summary of a checked file of either format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSummary {
    /// A `.safetensors` file.
    Safetensors(SafetensorsSummary),
    /// A `.gguf` file.
    Gguf(GgufSummary),
}

impl ModelSummary {
    /// How many tensors the file holds.
    pub fn tensor_count(&self) -> usize {
        match self {
            Self::Safetensors(s) => s.tensors.len(),
            Self::Gguf(g) => g.tensors.len(),
        }
    }
}

/// Checks a weights file with the default [`Limits`], choosing the format by
/// extension (case-insensitive): `.safetensors` or `.gguf`; pickle extensions
/// are refused ([`refuse_pickle`]) and anything else is
/// [`GuardError::UnknownFormat`].
pub fn check_model_file(path: &Path) -> Result<ModelSummary, GuardError> {
    check_model_file_with(path, &Limits::default())
}

/// [`check_model_file`] with explicit limits.
pub fn check_model_file_with(path: &Path, limits: &Limits) -> Result<ModelSummary, GuardError> {
    refuse_pickle(path)?;
    match extension(path).as_deref() {
        Some("safetensors") => check_safetensors(path, limits).map(ModelSummary::Safetensors),
        Some("gguf") => check_gguf(path, limits).map(ModelSummary::Gguf),
        _ => Err(GuardError::UnknownFormat {
            path: path.to_path_buf(),
        }),
    }
}

/// Refuses pickle checkpoints by extension ([`PICKLE_EXTENSIONS`],
/// case-insensitive): unpickling runs whatever code the file names, so such a
/// file must be converted to safetensors in a trusted sandbox instead. Any
/// other path is `Ok` (this says nothing about its contents).
pub fn refuse_pickle(path: &Path) -> Result<(), GuardError> {
    match extension(path) {
        Some(ext) if PICKLE_EXTENSIONS.contains(&ext.as_str()) => Err(GuardError::PickleRefused {
            path: path.to_path_buf(),
            extension: path
                .extension()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or(ext),
        }),
        _ => Ok(()),
    }
}

fn extension(path: &Path) -> Option<String> {
    path.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pickle_extensions_are_refused_case_insensitively() {
        for name in ["pytorch_model.bin", "a.PT", "b.pth", "c.pkl", "d.Ckpt"] {
            let err = refuse_pickle(Path::new(name)).expect_err(name);
            assert!(
                matches!(err, GuardError::PickleRefused { .. }),
                "{name}: {err}"
            );
            let message = err.to_string();
            assert!(message.contains("arbitrary code"), "{message}");
            assert!(message.contains("safetensors"), "{message}");
        }
        for name in [
            "model.safetensors",
            "m.gguf",
            "bin",
            "notes.txt",
            "x.binary",
        ] {
            refuse_pickle(Path::new(name)).expect(name);
        }
    }

    #[test]
    fn model_files_dispatch_on_extension() {
        let err = check_model_file(Path::new("weights.pt")).expect_err("pickle");
        assert!(
            matches!(err, GuardError::PickleRefused { ref extension, .. } if extension == "pt")
        );
        let err = check_model_file(Path::new("weights.npz")).expect_err("unknown");
        assert!(matches!(err, GuardError::UnknownFormat { .. }));
        let err = check_model_file(Path::new("/nonexistent/w.SAFETENSORS")).expect_err("missing");
        assert!(matches!(err, GuardError::Io { .. }));
        let err = check_model_file(Path::new("/nonexistent/w.gguf")).expect_err("missing");
        assert!(matches!(err, GuardError::Io { .. }));
    }
}
