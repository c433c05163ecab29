//! Errors of loading and running a DSpark drafter, each naming the file, key
//! or value at fault.

use std::path::PathBuf;

use spec_runtime::ModelError;

/// What went wrong loading or running a DSpark checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum DSparkError {
    /// `config.json` could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not JSON; the parser's error is the `source()`.
    #[error("{path}: not a JSON config object: {source}")]
    JsonParse {
        /// The config file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// `config.json` is not a JSON object.
    #[error("{path}: not a JSON config object: {message}")]
    Json {
        /// The config file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The checkpoint is not a DSpark drafter.
    #[error(
        "{path}: not a DSpark checkpoint (architectures {found}, expected [\"Gemma4DSparkModel\"])"
    )]
    NotDSpark {
        /// The config file.
        path: PathBuf,
        /// What `architectures` holds.
        found: String,
    },
    /// A key the drafter needs is absent.
    #[error("{path}: missing config key `{key}`")]
    MissingKey {
        /// The config file.
        path: PathBuf,
        /// The key.
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
        /// What differs.
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
    /// The request's sampler failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
}

impl From<DSparkError> for spec_core::SpecError {
    fn from(e: DSparkError) -> Self {
        match e {
            DSparkError::Mlx(inner) => spec_core::SpecError::Mlx(inner),
            DSparkError::Model(ModelError::Mlx(inner)) => spec_core::SpecError::Mlx(inner),
            DSparkError::Model(ModelError::Spec(inner)) | DSparkError::Spec(inner) => inner,
            other => spec_core::SpecError::provider_failed(crate::ID, other),
        }
    }
}

impl spec_runtime::config_keys::KeyError for DSparkError {
    fn missing(path: &std::path::Path, key: String) -> Self {
        DSparkError::MissingKey {
            path: path.to_path_buf(),
            key,
        }
    }
    fn invalid(path: &std::path::Path, key: String, message: String) -> Self {
        DSparkError::InvalidValue {
            path: path.to_path_buf(),
            key,
            message,
        }
    }
    fn unsupported(path: &std::path::Path, key: String, value: String, supported: String) -> Self {
        DSparkError::Unsupported {
            path: path.to_path_buf(),
            key,
            value,
            supported,
        }
    }
}
