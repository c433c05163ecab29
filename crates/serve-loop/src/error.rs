//! Errors of a request.

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The request's cached prefix covers the whole prompt.
    #[error("the cached prefix holds {cached} tokens of a {prompt}-token prompt: at least one must be left to run")]
    PrefixTooLong {
        /// Tokens the prefix caches hold.
        cached: usize,
        /// Tokens in the prompt.
        prompt: usize,
    },
    /// The provider reads tapped target layers, which a cached prefix lacks.
    #[error("provider `{provider}` reads tapped target layers of the whole prompt, which a cached prefix does not have: run it without the prompt cache")]
    PrefixWithTaps {
        /// The provider's id.
        provider: String,
    },
    /// A target, cache, sampler or source failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
    /// A draft source failed (opening, prefill, draft or commit): only its
    /// request fails.
    #[error("draft provider `{provider}` failed: {source}")]
    Source {
        /// The provider's id.
        provider: String,
        /// What it reported.
        source: spec_core::SpecError,
    },
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The engine holds as many requests as it may (active and queued).
    #[error("the engine is full: {limit} requests active or queued")]
    Busy {
        /// Requests active plus queued.
        limit: usize,
    },
    /// The request asks for a provider the engine did not load.
    #[error("no draft provider `{id}` is loaded (loaded: {loaded})")]
    NoSuchProvider {
        /// The id asked for.
        id: String,
        /// The loaded ids.
        loaded: String,
    },
    /// The prompt plus the tokens to generate exceed the model's context.
    #[error(
        "prompt ({prompt} tokens) plus max tokens ({max_tokens}) exceed the context of {context}"
    )]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Tokens asked for.
        max_tokens: usize,
        /// The model's context length.
        context: usize,
    },
    /// The request asks for speculation on a target whose caches cannot
    /// roll back a rejected draft (a cache type that keeps no way back):
    /// its output would not be plain decoding's.
    #[error("draft provider `{provider}` cannot speculate on this `{model_type}` model: its cache {cache} cannot roll back rejected drafts: decode without a draft provider")]
    NoRollback {
        /// The provider's id.
        provider: String,
        /// The target's architecture.
        model_type: String,
        /// The first cache that cannot roll back.
        cache: usize,
    },
    /// The engine thread has stopped (shut down, or its model failed to load).
    #[error("the engine has stopped")]
    Stopped,
    /// The engine thread panicked: no request can run any more
    /// ([`crate::Engine::failure`] holds the panic's message).
    #[error("the engine thread panicked: {0}")]
    Panicked(String),
    /// The engine could not build a provider for a request's own options:
    /// only that request fails.
    #[error("building draft provider `{provider}` for the request's options: {source}")]
    Build {
        /// The provider's id.
        provider: String,
        /// What the builder reported.
        #[source]
        source: spec_core::BoxError,
    },
    /// The engine's loader failed; its error is the source.
    #[error("loading the engine's model: {0}")]
    Load(#[source] spec_core::BoxError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

impl ServeError {
    /// A source's failure, naming its provider.
    pub(crate) fn source(provider: &str, source: spec_core::SpecError) -> Self {
        Self::Source {
            provider: provider.to_string(),
            source,
        }
    }
}
