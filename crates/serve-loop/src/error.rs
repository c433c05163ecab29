//! Errors of a request.

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A target, cache, sampler or source failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}
