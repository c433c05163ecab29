//! Errors of the pipeline.

use spec_core::SpecError;

/// What went wrong running a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A send or receive could not be built.
    #[error(transparent)]
    Dist(#[from] mlx_distributed::DistError),
    /// Exchanging with a neighbour failed (MLX's ring reports a lost peer
    /// as "\[ring\] connection to a peer was lost").
    #[error("rank {rank}: {what} rank {peer} failed: {source}")]
    Link {
        /// This process's rank.
        rank: usize,
        /// Receiving from or sending to.
        what: &'static str,
        /// The neighbour.
        peer: usize,
        /// MLX's error.
        source: mlx_rs::error::Exception,
    },
    /// A model stage failed.
    #[error("rank {rank}: {source}")]
    Stage {
        /// This process's rank.
        rank: usize,
        /// The stage's error.
        source: SpecError,
    },
    /// A peer sent something the protocol does not allow.
    #[error("pipeline protocol: {0}")]
    Protocol(String),
    /// A link's handshake failed, or this rank has no usable secret
    /// ([`authenticate`](crate::authenticate)).
    #[error("pipeline authentication: {0}")]
    Auth(String),
    /// The system gave no random bytes for a handshake's nonce.
    #[error("pipeline authentication: no random bytes from the system: {0}")]
    NoRandom(#[source] getrandom::Error),
    /// The group and the model do not fit together.
    #[error("pipeline setup: {0}")]
    Setup(String),
    /// An earlier exchange failed, leaving the ranks out of step: the
    /// pipeline runs no more (see [`PipelineHealth`](crate::PipelineHealth)).
    #[error("the pipeline is broken: {0}")]
    Broken(#[source] std::sync::Arc<PipelineError>),
}

impl From<PipelineError> for SpecError {
    fn from(e: PipelineError) -> Self {
        SpecError::Model(Box::new(e))
    }
}
