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
    /// A provider option's value failed its parser; the parser's error is
    /// the `source()`.
    #[error("draft provider `{provider}`: option `{key}` = `{value}`: {source}")]
    OptionValue {
        /// The provider id.
        provider: String,
        /// The option's key.
        key: String,
        /// The value given.
        value: String,
        /// The parser's error.
        source: BoxError,
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
    /// A request's constraint (its grammar) failed or reached a state that
    /// allows no token: the message is the constraint's own.
    #[error("constraint: {0}")]
    Constraint(String),
    /// A draft source was driven against its protocol (draft before commit,
    /// inconsistent counts, use after failure).
    #[error("draft source protocol: {0}")]
    Protocol(String),
    /// An input did not have the shape, count or value the interface
    /// requires: the caller's mistake, which it can branch on.
    #[error("invalid input: {0}")]
    Input(#[from] InputError),
    /// A broken invariant of mlx-spec's own code (a sampler that returned
    /// nothing, a buffer gone missing): a bug, never the caller's input.
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// Why an input was refused, with the values that explain it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    /// A batched forward (or a part of one) was given no rows.
    #[error("a batched forward needs at least one row")]
    EmptyBatch,
    /// A row of a batch has no tokens.
    #[error("row {row} of the batch has no tokens")]
    EmptyRow {
        /// The row's index.
        row: usize,
    },
    /// Something that needs tokens was given none.
    #[error("{what} needs at least one token")]
    NoTokens {
        /// What was given no tokens (`"a forward"`, `"prefill"`).
        what: &'static str,
    },
    /// An array (or a pair of them) has the wrong shape.
    #[error("{what} must be {expected}, got {}", shapes(.got))]
    Shape {
        /// What the array is.
        what: &'static str,
        /// The shape wanted (`"[B, L]"`, `"[1, 1, 4096]"`).
        expected: String,
        /// The shapes given (none when the array is absent).
        got: Vec<Vec<i32>>,
    },
    /// Two counts that must agree do not.
    #[error("{what}: {expected} expected, got {got}")]
    Count {
        /// What is counted.
        what: &'static str,
        /// The count required.
        expected: usize,
        /// The count given.
        got: usize,
    },
    /// A row's cache set holds a number of caches this model does not make.
    #[error(
        "{}{got} caches for {layers} layers, {expected} expected ({layout})",
        row_prefix(*.row)
    )]
    CacheCount {
        /// The row of a batch of several (`None` for a single row).
        row: Option<usize>,
        /// The model's (or stage's) decoder layers.
        layers: usize,
        /// Caches this model makes.
        expected: usize,
        /// Caches in the set.
        got: usize,
        /// How the model lays out its caches.
        layout: &'static str,
    },
    /// A cache set has no cache at an index the model reads.
    #[error("no cache in slot {slot} of a set of {len} (not this model's caches?)")]
    CacheSlot {
        /// The index.
        slot: usize,
        /// Caches in the set.
        len: usize,
    },
    /// A cache is not of the kind this model or layer needs (another
    /// model's, another target's, a handle that holds no keys).
    #[error("{0}")]
    ForeignCache(String),
    /// A cache was given more rows than its limit.
    #[error("a cache limited to {limit} rows cannot hold {rows}")]
    CacheFull {
        /// Rows it may hold.
        limit: usize,
        /// Rows it was asked to hold.
        rows: usize,
    },
    /// A tapped layer index is not a layer of the model.
    #[error("tap layer {index} out of range ({layers} layers)")]
    TapOutOfRange {
        /// The index asked for.
        index: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// A per-row list has no entry for a row.
    #[error("no {what} for row {row} (of {rows})")]
    MissingRow {
        /// What the list holds.
        what: &'static str,
        /// The row asked for.
        row: usize,
        /// Entries in the list.
        rows: usize,
    },
    /// A value does not fit MLX's 32-bit indices.
    #[error("{what} {value} is too large (at most {})", i32::MAX)]
    TooLarge {
        /// What the value is (`"position"`, `"top_k"`).
        what: &'static str,
        /// The value.
        value: usize,
    },
    /// A sampling parameter is out of its range.
    #[error("{name} must be {expected}, got {value}")]
    SamplerParam {
        /// The parameter's name as requests spell it (`"top_p"`).
        name: &'static str,
        /// The value given (`top_k` as the nearest `f32`).
        value: f32,
        /// Its range, in words.
        expected: String,
    },
    /// A part of the model this call needs was not loaded.
    #[error("this model has no {part}")]
    NotLoaded {
        /// The part (`"head"`, `"final norm"`, `"loaded MTP row"`).
        part: &'static str,
    },
    /// A whole-model call reached a model that holds one pipeline stage.
    #[error(
        "this model holds layers {start}..{end} of {total} (pipeline rank {rank} of {size}): \
         run it through a pipeline"
    )]
    PipelineStage {
        /// First held layer.
        start: usize,
        /// One past the last held layer.
        end: usize,
        /// Layers of the whole model.
        total: usize,
        /// The stage's rank.
        rank: usize,
        /// Ranks in the pipeline.
        size: usize,
    },
}

/// `got` shapes as `[1, 2] and [3]`, `none` when empty.
fn shapes(got: &[Vec<i32>]) -> String {
    if got.is_empty() {
        return "none".into();
    }
    got.iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// `row {r}: ` for a row of a batch of several, nothing otherwise.
fn row_prefix(row: Option<usize>) -> String {
    row.map(|r| format!("row {r}: ")).unwrap_or_default()
}

impl InputError {
    /// A shape error for one array.
    pub fn shape(what: &'static str, expected: impl Into<String>, got: &[i32]) -> Self {
        Self::Shape {
            what,
            expected: expected.into(),
            got: vec![got.to_vec()],
        }
    }

    /// A shape error for a pair of arrays.
    pub fn shapes(what: &'static str, expected: impl Into<String>, a: &[i32], b: &[i32]) -> Self {
        Self::Shape {
            what,
            expected: expected.into(),
            got: vec![a.to_vec(), b.to_vec()],
        }
    }
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
        let e = SpecError::from(InputError::EmptyRow { row: 2 });
        assert_eq!(
            report(&e),
            "invalid input: row 2 of the batch has no tokens"
        );
    }

    #[test]
    fn input_errors_say_their_values() {
        let e = InputError::CacheCount {
            row: Some(1),
            layers: 4,
            expected: 4,
            got: 3,
            layout: "one per layer",
        };
        assert_eq!(
            e.to_string(),
            "row 1: 3 caches for 4 layers, 4 expected (one per layer)"
        );
        let e = InputError::shapes("a KV pair", "[B, heads, L, D]", &[1, 2], &[3]);
        assert_eq!(
            e.to_string(),
            "a KV pair must be [B, heads, L, D], got [1, 2] and [3]"
        );
        let e = InputError::Shape {
            what: "taps",
            expected: "3 rows".into(),
            got: Vec::new(),
        };
        assert_eq!(e.to_string(), "taps must be 3 rows, got none");
    }
}
