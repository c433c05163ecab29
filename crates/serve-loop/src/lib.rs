//! The serve loop: runs one request against a target model, with exactly
//! one draft provider (or none: plain decoding), in mlx-lm's round shape:
//! draft -> one target forward over `[pending, drafts..]` -> accept the
//! longest matching prefix (or Leviathan rejection sampling) -> trim the
//! caches -> commit to the source -> emit.
//!
//! This crate never names a concrete provider.
#![warn(missing_docs)]

mod adaptive;
mod config;
mod error;
mod facade;
mod generate;
pub mod goodput;
pub mod prefix_cache;
mod priors;
mod provider_slots;
mod request;
mod reuse;
mod scheduler;
mod shared_prefill;
pub mod step_cost;
mod stop;
mod types;
pub mod verify;

pub use adaptive::DraftController;
pub use config::{AdaptiveConfig, SpecConfig, VerifyMode};
pub use error::ServeError;
pub use facade::{
    Completion, Engine, EngineConfig, EngineStats, Event, Loaded, ProviderFactory, RequestHandle,
};
pub use generate::{generate, generate_with};
pub use goodput::DraftPolicy;
pub use prefix_cache::{
    cache_partition, Boundaries, Hit, PrefixCache, PrefixCacheConfig, PrefixCacheStats,
    PrefixStore, SavedDrafts, StoredEntry, DEFAULT_PREFIX_CACHE_BYTES,
    DEFAULT_PREFIX_CACHE_ENTRIES,
};
pub use scheduler::{
    Finished, JobId, PipelinedReport, ScheduleConfig, Scheduler, StepReport, DEFAULT_PREFILL_CHUNK,
};
pub use spec_core::SpecStats;
pub use step_cost::{Fit, StepCost, StepCostStats};
pub use stop::StopMatcher;
pub use types::{Emitted, Finish, Output, OwnHook, PromptLogprob, ProviderChoice, Request};

/// Resolves `id` in the registry and builds the provider for `target`.
pub fn build_provider(
    id: &str,
    target: &dyn spec_core::Target,
    options: &spec_core::ProviderOptions,
) -> Result<Box<dyn spec_core::DraftProvider>, ServeError> {
    let registration = spec_core::resolve(id)?;
    Ok((registration.build)(target, options)?)
}
