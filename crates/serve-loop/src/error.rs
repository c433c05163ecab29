//! Errors of a request.

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The request's cached prefix covers the whole prompt.
    #[error("the cached prefix holds {cached} tokens of a {prompt}-token prompt: at least one must be left to run")]
    PrefixTooLong {
        /// Tokens the prefix caches hold.
        cached: usize,
        /// Tokens in the prompt.
        prompt: usize,
    },
    /// The provider reads tapped target layers, which a cached prefix lacks.
    #[error("provider `{provider}` reads tapped target layers of the whole prompt, which a cached prefix does not have: run it without the prompt cache")]
    PrefixWithTaps {
        /// The provider's id.
        provider: String,
    },
    /// A target, cache, sampler or source failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}
