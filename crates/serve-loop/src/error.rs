//! Errors of a request.

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
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
    /// The caches handed in as the prompt's prefix hold the whole prompt
    /// (or more): at least its last token must run.
    #[error("the prefix caches hold {cached} tokens, the prompt only {prompt}")]
    PrefixTooLong {
        /// Tokens the caches hold.
        cached: usize,
        /// Tokens of the prompt.
        prompt: usize,
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
    /// The engine thread has stopped (shut down, or its model failed to load).
    #[error("the engine has stopped")]
    Stopped,
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
