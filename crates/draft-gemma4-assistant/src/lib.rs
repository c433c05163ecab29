//! Draft provider `gemma4-assistant`: Gemma-4's "assistant" drafter
//! (`gemma4_assistant`, `gemma4_unified_assistant`), a few Q-only blocks
//! that keep no cache of their own and attend over the target's last
//! sliding and last full KV caches (the donors). Each draft step feeds
//! `concat(target_embed(token) * sqrt(backbone), hidden)` through
//! `pre_projection`, the blocks and the drafter's head (tied or centroid);
//! `post_projection` gives the hidden of the next step. The first hidden is
//! the target's post-norm hidden at the position that predicted the
//! pending token. Semantics: optiq 0.7.7 `spec_generate` (the seed's
//! `specGenerate`).
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
pub use source::{AssistantSource, PositionMode};

/// The registered id.
pub const ID: &str = "gemma4-assistant";
