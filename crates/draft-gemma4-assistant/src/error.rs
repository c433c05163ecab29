//! What can go wrong loading, opening or running the assistant drafter.

use std::path::PathBuf;

use spec_models::ModelError;

/// Errors of this crate, each naming the file, tensor or target fact at fault.
#[derive(Debug, thiserror::Error)]
pub enum AssistantError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not valid or describes an impossible drafter.
    #[error("{path}: invalid assistant config: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `config.json` is not JSON; the parser's error is the `source()`.
    #[error("{path}: invalid assistant config: {source}")]
    ConfigJson {
        /// The config file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// The checkpoint is not a Gemma-4 assistant.
    #[error("{path}: model_type `{model_type}` is not a Gemma-4 assistant (expected gemma4_assistant or gemma4_unified_assistant)")]
    NotAnAssistant {
        /// The config file.
        path: PathBuf,
        /// Its model_type.
        model_type: String,
    },
    /// A weight is missing, misshapen or unexpected (from the shared loader).
    #[error(transparent)]
    Weights(#[from] ModelError),
    /// `masked_embedding.token_ordering` does not list every token once.
    #[error(
        "masked_embedding.token_ordering is not a permutation of the {vocab} token ids: {problem}"
    )]
    TokenOrdering {
        /// Vocabulary size.
        vocab: i32,
        /// What is wrong.
        problem: String,
    },
    /// The target cannot host this drafter.
    #[error("target incompatible with the assistant: {0}")]
    IncompatibleTarget(String),
    /// The target's donor caches cannot be read this round.
    #[error("donor caches: {0}")]
    Donors(String),
    /// A call the drafter makes into the target (its embedding, its donor
    /// caches) failed; the target's error is the source.
    #[error("target {what}: {source}")]
    Target {
        /// The call.
        what: &'static str,
        /// The target's error.
        source: spec_core::SpecError,
    },
    /// An input to a drafter step has the wrong shape.
    #[error("assistant step input: {0}")]
    Input(String),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

impl From<AssistantError> for spec_core::SpecError {
    fn from(e: AssistantError) -> Self {
        match e {
            AssistantError::Mlx(inner) => spec_core::SpecError::Mlx(inner),
            other => spec_core::SpecError::provider_failed(crate::ID, other),
        }
    }
}
