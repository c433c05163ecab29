//! What a constrained request must match, shared by `serve`'s
//! `response_format` and `generate`'s `--json-schema`, `--grammar` and
//! `--regex`.

use serde_json::Value;

/// The shape of `spec_grammar`'s `GrammarSpec` (the same variants), which
/// replaces it once that crate is in the build.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON document valid against the schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// A Lark-style grammar (llguidance's syntax).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}
