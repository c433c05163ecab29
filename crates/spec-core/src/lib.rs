//! The interfaces every other crate of mlx-spec agrees on: the view of a
//! target model (`Target`), its per-request caches (`LayerCache`,
//! `CacheSet`), token samplers (`Sampler`) and the errors they report.
//!
//! `DraftProvider` / `DraftSource` are the proposer's side, `registry` the
//! `inventory`-based provider registry and `options` the typed reading of
//! a provider's options. The crate re-exports the [`mlx_rs`] it is built
//! on, so a provider crate uses exactly that version.
//!
//! This crate knows no concrete model and no concrete provider.
//!
//! # Writing a provider
//!
//! A provider crate implements [`DraftProvider`] (loaded once per target)
//! and [`DraftSource`] (one per request), reads its options with
//! [`ProviderOptions::reader`] and registers with [`register_provider!`];
//! a host that links the crate can then select it by id. This one proposes
//! the last token again, `length` times:
//!
//! ```
//! use spec_core::mlx_rs::Array;
//! use spec_core::{
//!     CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, ProviderOptions, Sampler,
//!     SpecError, Target,
//! };
//!
//! const ID: &str = "repeat";
//!
//! /// The provider: its options, parsed once.
//! #[derive(Debug)]
//! struct Repeat {
//!     length: usize,
//! }
//!
//! impl Repeat {
//!     fn new(_target: &dyn Target, options: &ProviderOptions) -> Result<Self, SpecError> {
//!         // Unknown keys are refused; errors name the provider and the key.
//!         let options = options.reader(ID, &["length"])?;
//!         let length = options.positive("length")?.unwrap_or(3);
//!         Ok(Self { length })
//!     }
//! }
//!
//! impl DraftProvider for Repeat {
//!     fn id(&self) -> &str {
//!         ID
//!     }
//!     fn default_num_draft(&self) -> usize {
//!         self.length
//!     }
//!     fn open<'t>(&self, _target: &'t dyn Target) -> Result<Box<dyn DraftSource + 't>, SpecError> {
//!         Ok(Box::new(RepeatSource))
//!     }
//! }
//!
//! /// One request's source: it keeps no state.
//! struct RepeatSource;
//!
//! impl DraftSource for RepeatSource {
//!     fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
//!         Ok(())
//!     }
//!     fn draft(
//!         &mut self,
//!         request: DraftRequest<'_>,
//!         _sampler: &mut dyn Sampler,
//!     ) -> Result<Draft, SpecError> {
//!         let last = request.history.last().copied();
//!         let last = last.ok_or_else(|| SpecError::Protocol("empty history".into()))?;
//!         Ok(Draft { tokens: vec![last; request.max_tokens], probs: None })
//!     }
//!     fn commit(&mut self, _info: CommitInfo<'_>) -> Result<(), SpecError> {
//!         Ok(())
//!     }
//! }
//!
//! spec_core::register_provider! {
//!     id: ID,
//!     description: "repeats the last token",
//!     build: Repeat::new,
//! }
//!
//! // What a host does: resolve the id (a crate that failed to register
//! // would be missing here).
//! let registration = spec_core::resolve(ID).expect("registered");
//! assert_eq!(registration.description, "repeats the last token");
//! ```
#![deny(missing_docs)]

pub mod cache;
pub mod constraint;
pub mod driver;
pub mod error;
pub mod head;
pub mod logits;
pub mod options;
pub mod provider;
pub mod registry;
pub mod request_options;
pub mod sampler;
pub mod stats;
pub mod target;

pub use cache::{CacheKind, CacheSet, CacheState, LayerCache};
pub use constraint::{Constraint, TokenMask};
pub use error::{BoxError, InputError, SpecError};
pub use inventory;
pub use logits::{
    FrequencyPenalty, LogitBias, LogitsProcessor, Penalties, PresencePenalty, RepetitionPenalty,
    DEFAULT_PENALTY_CONTEXT, MAX_LOGIT_BIAS,
};
pub use mlx_rs;
pub use options::{DtypePolicy, OptionReader, ProviderOptions, DTYPE_CHOICES};
pub use provider::{
    check_history, CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, OpenContext,
    PersistedDraft, PrefillMode, RequestOutcome, SavedDraft,
};
pub use registry::{registrations, resolve, ProviderRegistration};
pub use request_options::{
    check_request_options, merge_request_options, OptionRange, RequestOption,
};
pub use sampler::{GreedySampler, Sampler, SamplerConfig, StochasticSampler};
pub use stats::SpecStats;
pub use target::{BatchOutput, BatchRow, RowForm, Target, TargetInfo, TargetOutput};
