//! Errors of loading and running a DFlash drafter, each naming the file, key
//! or value at fault.

use std::path::{Path, PathBuf};

use spec_runtime::config_keys::KeyError;
use spec_runtime::ModelError;

/// What went wrong loading or running a DFlash checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum DFlashError {
    /// `config.json` could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not a JSON object.
    #[error("{path}: not a JSON config object: {message}")]
    Json {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A key the drafter needs is absent.
    #[error("{path}: missing config key `{key}`")]
    MissingKey {
        /// The config file.
        path: PathBuf,
        /// The key (`dflash_config.` keys with that prefix).
        key: String,
    },
    /// A key holds a value of the wrong type or range.
    #[error("{path}: config key `{key}`: {message}")]
    InvalidValue {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A key holds a value this implementation does not support.
    #[error("{path}: config key `{key}` = {value} is not supported (supported: {supported})")]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
        /// Its value, as JSON.
        value: String,
        /// What is supported.
        supported: String,
    },
    /// The drafter does not fit the target it was opened for.
    #[error("the drafter does not fit the target: {what}: drafter {drafter}, target {target}")]
    TargetMismatch {
        /// The config key that differs.
        what: String,
        /// The drafter's value.
        drafter: String,
        /// The target's value.
        target: String,
    },
    /// An input of the drafter's forward has the wrong shape.
    #[error("{what} has shape {found:?}, expected {expected}")]
    Shape {
        /// The input.
        what: String,
        /// Its shape.
        found: Vec<i32>,
        /// What was expected.
        expected: String,
    },
    /// Loading a tensor failed (missing, mis-shaped, leftover), or a layer
    /// failed to run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// The target's embedding or head, or the request's sampler, failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
}

impl KeyError for DFlashError {
    fn missing(path: &Path, key: String) -> Self {
        DFlashError::MissingKey {
            path: path.to_path_buf(),
            key,
        }
    }
    fn invalid(path: &Path, key: String, message: String) -> Self {
        DFlashError::InvalidValue {
            path: path.to_path_buf(),
            key,
            message,
        }
    }
    fn unsupported(path: &Path, key: String, value: String, supported: String) -> Self {
        DFlashError::Unsupported {
            path: path.to_path_buf(),
            key,
            value,
            supported,
        }
    }
}

impl From<DFlashError> for spec_core::SpecError {
    fn from(e: DFlashError) -> Self {
        match e {
            DFlashError::Mlx(inner) => spec_core::SpecError::Mlx(inner),
            DFlashError::Model(ModelError::Mlx(inner)) => spec_core::SpecError::Mlx(inner),
            DFlashError::Model(ModelError::Spec(inner)) | DFlashError::Spec(inner) => inner,
            other => spec_core::SpecError::provider_failed(crate::ID, other),
        }
    }
}
