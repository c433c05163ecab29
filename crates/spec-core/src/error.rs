//! The error type shared by the interfaces of this crate.

/// What can go wrong behind a `Target`, a cache or a sampler.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// An MLX operation failed (shape mismatch, out of memory, ...).
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// A cache was asked to roll back further than it can.
    #[error("cache cannot trim {requested} tokens: {reason}")]
    Trim {
        /// Tokens asked to drop.
        requested: usize,
        /// Why not (e.g. a rotating cache already wrapped past its window).
        reason: String,
    },
    /// An input did not have the shape or type the interface requires.
    #[error("invalid input: {0}")]
    Invalid(String),
}
