//! The public value types a request is made of (what a host hands in,
//! what it gets back), apart from the code that runs them.

use std::sync::atomic::AtomicBool;

use spec_core::{DraftProvider, LogitsProcessor, Sampler, SpecStats};

use crate::SpecConfig;

/// The provider a request speculates with, and how.
pub struct Speculation<'a> {
    /// The provider (its source is opened for this request).
    pub provider: &'a dyn DraftProvider,
    /// Settings.
    pub config: SpecConfig,
}

impl std::fmt::Debug for Speculation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("provider", &self.provider.id())
            .field("config", &self.config)
            .finish()
    }
}

/// One generation request.
pub struct Request<'a> {
    /// Prompt token ids (at least one).
    pub prompt: &'a [u32],
    /// Most tokens to emit (drafts included: never more).
    pub max_tokens: usize,
    /// Tokens that end the request (never emitted).
    pub is_eos: &'a dyn Fn(u32) -> bool,
    /// The request's sampler, shared by drafting and verification.
    pub sampler: &'a mut dyn Sampler,
    /// Applied to the logits of every verified position before sampling.
    pub processors: &'a mut [Box<dyn LogitsProcessor>],
    /// Speculation; `None` decodes plainly.
    pub speculation: Option<Speculation<'a>>,
    /// Checked between rounds; set to stop the request.
    pub cancel: Option<&'a AtomicBool>,
    /// Who the request is for (the provider's [`spec_core::OpenContext`]);
    /// with the salt, the prefix cache's partition
    /// ([`crate::prefix_cache::cache_partition`]).
    pub tenant: Option<&'a str>,
    /// Partitions the prefix cache further (OpenAI/vLLM's `cache_salt`):
    /// only requests with the same salt share cached prefixes.
    pub cache_salt: Option<&'a str>,
    /// Caches already holding `prompt[..offset]` (a prompt-cache file or a
    /// cached prefix): prefill starts at their offset. At least one prompt
    /// token must be left; a provider that reads tapped layers is refused.
    pub prefix: Option<spec_core::CacheSet>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("speculation", &self.speculation)
            .finish_non_exhaustive()
    }
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token.
    Eos,
    /// `max_tokens` emitted.
    MaxTokens,
    /// The host's token callback asked to stop (e.g. a stop string).
    Stopped,
    /// The cancel flag was set.
    Cancelled,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Output {
    /// Emitted tokens.
    pub tokens: Vec<u32>,
    /// Log-probability of each emitted token under the target's processed
    /// distribution at its position (the verify window's, when speculating).
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: Finish,
    /// Speculation statistics.
    pub stats: SpecStats,
    /// Seconds until the first token was known (prompt processing).
    pub prompt_seconds: f64,
    /// Seconds of generation after that.
    pub generation_seconds: f64,
    /// Prompt tokens whose caches came ready (a prefix cache hit or a
    /// request's own prefix) instead of being prefilled.
    pub cached_tokens: usize,
}
