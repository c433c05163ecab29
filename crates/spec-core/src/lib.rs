//! The interfaces every other crate of mlx-spec agrees on: the view of a
//! target model (`Target`), its per-request caches (`LayerCache`,
//! `CacheSet`), token samplers (`Sampler`) and the errors they report.
//!
//! `DraftProvider` / `DraftSource` are the proposer's side and `registry`
//! the `inventory`-based provider registry.
//!
//! This crate knows no concrete model and no concrete provider.
#![warn(missing_docs)]

pub mod cache;
pub mod error;
pub mod logits;
pub mod provider;
pub mod registry;
pub mod sampler;
pub mod stats;
pub mod target;

pub use cache::{CacheSet, LayerCache};
pub use error::SpecError;
pub use inventory;
pub use logits::{LogitsProcessor, RepetitionPenalty};
pub use provider::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, PrefillMode, ProviderOptions,
};
pub use registry::{registrations, resolve, ProviderRegistration};
pub use sampler::{GreedySampler, Sampler, SamplerConfig, StochasticSampler};
pub use stats::SpecStats;
pub use target::{Target, TargetInfo, TargetOutput};
