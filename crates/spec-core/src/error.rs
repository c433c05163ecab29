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
    /// No provider is registered under this id.
    #[error("unknown draft provider `{id}` (available: {available})")]
    UnknownProvider {
        /// The id asked for.
        id: String,
        /// The registered ids.
        available: String,
    },
    /// Two crates registered the same provider id.
    #[error("draft provider id `{id}` is registered twice, by crates `{first}` and `{second}`")]
    DuplicateProvider {
        /// The id.
        id: String,
        /// One crate.
        first: String,
        /// The other crate.
        second: String,
    },
    /// A provider could not be built or opened (bad options, incompatible target).
    #[error("draft provider `{id}`: {message}")]
    Provider {
        /// The provider id.
        id: String,
        /// What is wrong.
        message: String,
    },
    /// A draft source was driven against its protocol (draft before commit,
    /// inconsistent counts, use after failure).
    #[error("draft source protocol: {0}")]
    Protocol(String),
    /// An input did not have the shape or type the interface requires.
    #[error("invalid input: {0}")]
    Invalid(String),
}
