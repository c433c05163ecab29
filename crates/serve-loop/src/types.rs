//! The public value types a request is made of (what a host hands in,
//! what it gets back), apart from the code that runs them.

use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use spec_core::{Constraint, LogitsProcessor, ProviderOptions, SamplerConfig, SpecStats};

use crate::SpecConfig;

/// The provider a request speculates with, by id, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderChoice {
    /// The id of a provider the runner holds ([`crate::generate`]'s
    /// providers, [`crate::Scheduler::with_providers`], the engine's
    /// [`crate::Loaded::providers`]), or one the engine's
    /// [`crate::Loaded::factory`] builds when `options` is not empty.
    pub id: String,
    /// Settings.
    pub config: SpecConfig,
    /// The provider's own options for this request; empty: the held
    /// provider `id`.
    pub options: ProviderOptions,
}

impl ProviderChoice {
    /// The provider `id` with these settings, without options.
    pub fn new(id: impl Into<String>, config: SpecConfig) -> Self {
        Self {
            id: id.into(),
            config,
            options: ProviderOptions::new(),
        }
    }
}

/// One generation request, owned (it may cross threads): the one shape
/// [`crate::generate`], [`crate::Scheduler::submit`] and
/// [`crate::Engine::submit`] take.
pub struct Request {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to emit (drafts included: never more).
    pub max_tokens: usize,
    /// Tokens that end the request (never emitted).
    pub eos: Vec<u32>,
    /// Sampling parameters and seed: the request's sampler, built for the
    /// target's vocabulary, is shared by drafting and verification.
    pub sampler: SamplerConfig,
    /// Applied to the logits of every verified position before sampling.
    pub processors: Vec<Box<dyn LogitsProcessor + Send>>,
    /// What the output must match (a grammar): every verified position is
    /// masked by it, drafts are cut at its first refused token, and the
    /// tokens it forces are drafted for free. `None`: unconstrained.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Whether the tokens the constraint forces are drafted (and verified
    /// like any draft: the output is the same either way, only faster).
    pub forced_drafts: bool,
    /// How many of the most likely tokens to report beside each emitted
    /// one ([`Output::top_logprobs`], [`Emitted::top_logprobs`]); 0: none.
    pub top_logprobs: usize,
    /// `Some(n)`: score the prompt too ([`Output::prompt_logprobs`]), with
    /// each position's `n` most likely tokens. The whole prompt then runs
    /// (no cached prefix is read).
    pub prompt_logprobs: Option<usize>,
    /// What the output is expected to be, as tokens (OpenAI's predicted
    /// outputs): given to the provider's source
    /// ([`spec_core::OpenContext::prediction`]), which may draft from it;
    /// it changes no emitted token. Empty: none.
    pub prediction: Vec<u32>,
    /// Speculation; `None` decodes plainly.
    pub speculation: Option<ProviderChoice>,
    /// Who the request is for (the provider's [`spec_core::OpenContext`]);
    /// with the salt, the prefix cache's partition
    /// ([`crate::prefix_cache::cache_partition`]).
    pub tenant: Option<String>,
    /// Partitions the prefix cache further (OpenAI/vLLM's `cache_salt`):
    /// only requests with the same salt share cached prefixes.
    pub cache_salt: Option<String>,
    /// Checked between rounds; set to stop the request
    /// ([`Finish::Cancelled`]). The engine's [`crate::RequestHandle`]
    /// cancels through this flag when one is given.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Sees each emitted token first, wherever the request runs (before the
    /// runner's own callback or stream): a stop-string matcher; `Break`
    /// stops the request ([`Finish::Stopped`]).
    pub on_token: Option<OwnHook>,
}

/// A request's own token hook ([`Request::on_token`]).
pub type OwnHook = Box<dyn FnMut(&Emitted<'_>) -> ControlFlow<()> + Send>;

/// One emitted token, as hooks and streams see it.
#[derive(Debug, Clone, Copy)]
pub struct Emitted<'e> {
    /// The token id.
    pub token: u32,
    /// Its log-probability under the target's distribution at its position
    /// after the processors and the constraint's mask.
    pub logprob: f32,
    /// The most likely tokens there and their log-probabilities, most
    /// likely first ([`Request::top_logprobs`] of them).
    pub top_logprobs: &'e [(u32, f32)],
}

impl Request {
    /// A greedy, plain request with no EOS token.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            eos: Vec::new(),
            sampler: SamplerConfig::default(),
            processors: Vec::new(),
            constraint: None,
            forced_drafts: true,
            top_logprobs: 0,
            prompt_logprobs: None,
            prediction: Vec::new(),
            speculation: None,
            tenant: None,
            cache_salt: None,
            cancel: None,
            on_token: None,
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("sampler", &self.sampler)
            .field("constrained", &self.constraint.is_some())
            .field("top_logprobs", &self.top_logprobs)
            .field("prompt_logprobs", &self.prompt_logprobs)
            .field("prediction", &self.prediction.len())
            .field("speculation", &self.speculation)
            .finish_non_exhaustive()
    }
}
/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token, or the request's constraint was complete (nothing but
    /// an EOS token could follow).
    Eos,
    /// `max_tokens` emitted.
    MaxTokens,
    /// The host's token callback asked to stop (e.g. a stop string).
    Stopped,
    /// The cancel flag was set.
    Cancelled,
}

/// A prompt token's score ([`Output::prompt_logprobs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// Its log-probability under the target's own distribution (float32;
    /// no processor or constraint applies to a prompt).
    pub logprob: f32,
    /// The most likely tokens at its position, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Output {
    /// Emitted tokens.
    pub tokens: Vec<u32>,
    /// Log-probability of each emitted token under the target's processed
    /// distribution at its position (the verify window's, when speculating).
    pub logprobs: Vec<f32>,
    /// The most likely tokens at each emitted token's position, most
    /// likely first ([`Request::top_logprobs`] of them; empty lists when
    /// none were asked for).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// With [`Request::prompt_logprobs`]: each prompt token after the
    /// first, scored at the position before it; else empty.
    pub prompt_logprobs: Vec<PromptLogprob>,
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
