//! The error type shared by the interfaces of this crate.

/// Another crate's error, kept whole as a [`SpecError`]'s `source()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong behind a `Target`, a cache, a sampler or a provider.
///
/// Errors of other crates are kept whole as the `source()` of
/// [`SpecError::ProviderFailed`] and [`SpecError::Model`], whose own message
/// also says theirs (as the other error types of mlx-spec do); [`report`]
/// prints a chain without saying a message twice.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// An MLX operation failed (shape mismatch, out of memory, ...).
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// A cache was asked to roll back further than it can.
    #[error("cache cannot trim {requested} tokens: {reason}")]
    Trim {
        /// Tokens asked to drop.
        requested: usize,
        /// Why not (e.g. a rotating cache already wrapped past its window).
        reason: String,
    },
    /// No provider is registered under this id.
    #[error("unknown draft provider `{id}` (available: {available})")]
    UnknownProvider {
        /// The id asked for.
        id: String,
        /// The registered ids.
        available: String,
    },
    /// Two crates registered the same provider id.
    #[error("draft provider id `{id}` is registered twice, by crates `{first}` and `{second}`")]
    DuplicateProvider {
        /// The id.
        id: String,
        /// One crate.
        first: String,
        /// The other crate.
        second: String,
    },
    /// A provider could not be built or opened (bad options, incompatible target).
    #[error("draft provider `{id}`: {message}")]
    Provider {
        /// The provider id.
        id: String,
        /// What is wrong.
        message: String,
    },
    /// A provider failed with an error of its own crate (loading its
    /// checkpoint, a target it does not fit); that error is the `source()`.
    #[error("draft provider `{id}`: {source}")]
    ProviderFailed {
        /// The provider id.
        id: String,
        /// The provider crate's error.
        source: BoxError,
    },
    /// A model failed to load or run with an error of its crate (a missing
    /// tensor, a bad config); that error is the `source()`.
    #[error("{0}")]
    Model(#[source] BoxError),
    /// A request set a provider option it may not set (an operator's
    /// option, an unknown key) or a value out of its range.
    #[error("draft provider `{provider}`: option `{key}` cannot be set by a request: {reason}")]
    RequestOption {
        /// The provider id.
        provider: String,
        /// The option's key.
        key: String,
        /// Why not (what is expected).
        reason: String,
    },
    /// A draft source was driven against its protocol (draft before commit,
    /// inconsistent counts, use after failure).
    #[error("draft source protocol: {0}")]
    Protocol(String),
    /// An input did not have the shape or type the interface requires.
    #[error("invalid input: {0}")]
    Invalid(String),
}

/// `error` and its `source()` chain on one line, `: `-separated, leaving
/// out a cause whose message the line already holds (an error whose own
/// message includes its source's).
pub fn report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let message = e.to_string();
        if !line.contains(&message) {
            line.push_str(": ");
            line.push_str(&message);
        }
        cause = e.source();
    }
    line
}

impl SpecError {
    /// A provider error of `provider` from its crate's own `error`, kept as
    /// the `source()`.
    pub fn provider_failed(provider: impl Into<String>, error: impl Into<BoxError>) -> Self {
        Self::ProviderFailed {
            id: provider.into(),
            source: error.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn wrapped_errors_stay_in_the_source_chain() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = SpecError::provider_failed("p", Outer(io()));
        assert_eq!(e.to_string(), "draft provider `p`: outer");
        let source = e.source().expect("the provider's error");
        assert!(source.downcast_ref::<Outer>().is_some());
        assert_eq!(source.source().expect("its cause").to_string(), "gone");

        let e = SpecError::Model(Box::new(Outer(io())));
        assert_eq!(e.to_string(), "outer");
        assert!(e.source().expect("the model's error").is::<Outer>());
    }

    #[test]
    fn a_report_says_each_message_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = SpecError::provider_failed("p", Outer(io));
        assert_eq!(report(&e), "draft provider `p`: outer: gone");
        let e = SpecError::Invalid("x".into());
        assert_eq!(report(&e), "invalid input: x");
    }
}
