//! Pipeline-parallel targets over MLX's distributed layer. A model's decoder
//! layers are split over the ranks of a group as mlx-lm's `pipeline()`
//! splits them (`spec_models::pipeline`): rank 0 holds the last layers, the
//! final norm, the head and any drafter, and is the [`PipelineTarget`] the
//! serve loop drives; every other rank runs [`run_follower`].
//!
//! Each forward sends a small command down the ranks (`0 -> 1 -> .. ->
//! N-1`, neighbours only, in order: MLX's ring blocks a send until the
//! peer receives it): per row, the id of the head's cache set, its offset
//! before the step, the tokens and the form. A follower trims its copy of
//! that set to the offset first, so rejected drafts roll back with no
//! message of their own; a set dropped on the head is freed by the next
//! command, and one duplicated there (the serve loop's prefix cache) is
//! copied by the next. The hidden states flow back (`N-1 -> .. -> 0`), each rank
//! appending the outputs of the tapped layers it holds, and rank 0 runs its
//! layers and the final norm. Every rank runs its layers with the same
//! operations as the whole model in one process, so the results are the
//! same bits.
//!
//! Before any of it, every link proves that both ends hold the job's
//! secret ([`authenticate`]): MLX's ring connects whatever answers at a
//! rank's address.
//!
//! The first failed exchange breaks the pipeline for good
//! ([`PipelineHealth`]): the ranks are then out of step, so the head refuses
//! every later forward and its host stops.
#![warn(missing_docs)]

mod auth;
mod error;
mod follower;
mod head;
mod health;
mod link;
pub mod protocol;
mod remote;

pub use auth::{authenticate, PipelineSecret, SECRET_ENV};
pub use error::PipelineError;
pub use follower::{run_follower, FollowerReport};
pub use head::{PipelineStats, PipelineTarget};
pub use health::PipelineHealth;
