//! What can go wrong building a token environment or compiling a grammar.

use crate::GrammarKind;

/// An error building a [`crate::TokenEnv`] or compiling a
/// [`crate::GrammarSpec`].
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer could not be written as `tokenizer.json` text.
    #[error("reading the tokenizer's vocabulary: {0}")]
    Tokenizer(#[source] spec_text::TextError),

    /// The tokenizer's vocabulary could not be turned into token bytes, or
    /// does not fit the model.
    #[error("the vocabulary cannot be used for constrained decoding: {0}")]
    Vocabulary(String),

    /// The tokenizer names no end-of-sequence token.
    #[error("the tokenizer has no end-of-sequence token")]
    NoEndOfSequence,

    /// The grammar's source is larger than [`crate::GrammarLimits::max_source_bytes`].
    #[error("the {kind} is {bytes} bytes, over the limit of {limit}")]
    SourceTooLarge {
        /// The grammar's kind.
        kind: GrammarKind,
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },

    /// The grammar is invalid or unsupported; the message is llguidance's.
    #[error("invalid {kind}{}: {message}", at(.path))]
    Invalid {
        /// The grammar's kind.
        kind: GrammarKind,
        /// For a JSON schema, the JSON pointer of the subschema at fault,
        /// where one fails alone the same way (llguidance does not say).
        path: Option<String>,
        /// What llguidance reported.
        message: String,
    },

    /// Compiling the grammar went past llguidance's limits (lexer fuel,
    /// grammar size, lexer states).
    #[error("the {kind} is too complex: {message}")]
    TooComplex {
        /// The grammar's kind.
        kind: GrammarKind,
        /// What llguidance reported.
        message: String,
    },
}

fn at(path: &Option<String>) -> String {
    path.as_ref()
        .map_or_else(String::new, |path| format!(" at {path}"))
}
