//! Draft provider `gemma4-assistant`: Gemma-4's "assistant" drafter
//! (`gemma4_assistant`, `gemma4_unified_assistant`), a few Q-only blocks
//! that keep no cache of their own and attend over the target's last
//! sliding and last full KV caches (the donors). Each draft step feeds
//! `concat(target_embed(token) * sqrt(backbone), hidden)` through
//! `pre_projection`, the blocks and the drafter's head (tied or centroid);
//! `post_projection` gives the hidden of the next step. The first hidden is
//! the target's post-norm hidden at the position that predicted the
//! pending token. Query positions follow [`PositionMode`]: by default every
//! step of a round sits at the pending token's index, as transformers'
//! `SinglePositionMultiTokenCandidateGenerator` (the publisher's reference),
//! vLLM and SGLang place them; optiq 0.7.7's `spec_generate` (advancing one
//! per step) and the seed's `offset - 1` start are options. The op order of
//! a step is optiq's.
//!
//! Files: `config` (config.json), `block` (Q-only block), `head` (output
//! heads), `model` (the drafter step), `donors` (reading the target's
//! caches), `source` (the per-request source), `provider` (options, target
//! checks, registration).
#![warn(missing_docs)]

pub mod block;
pub mod config;
pub mod donors;
mod error;
pub mod head;
pub mod model;
mod provider;
pub mod source;

pub use block::DonorKv;
pub use config::{AssistantConfig, CentroidHead, HeadKind, LayerKind};
pub use error::AssistantError;
pub use model::{AssistantModel, DonorPair, StepOutput};
pub use provider::{AssistantProvider, Options};
pub use source::{AssistantSource, PositionMode, Round};

/// The registered id.
pub const ID: &str = "gemma4-assistant";
