//! What a request asks its output to match.

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

/// A request's grammar, before it is compiled against a vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value valid under this JSON Schema.
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// A sentence of this Lark grammar (llguidance's dialect).
    Lark(String),
    /// A string matching this regex, whole.
    Regex(String),
}

/// Which kind of grammar a [`GrammarSpec`] is, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrammarKind {
    /// [`GrammarSpec::JsonSchema`] or [`GrammarSpec::JsonObject`].
    JsonSchema,
    /// [`GrammarSpec::Lark`].
    Lark,
    /// [`GrammarSpec::Regex`].
    Regex,
}

impl std::fmt::Display for GrammarKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::JsonSchema => "JSON schema",
            Self::Lark => "Lark grammar",
            Self::Regex => "regex",
        })
    }
}

impl GrammarSpec {
    /// The kind of grammar.
    pub fn kind(&self) -> GrammarKind {
        match self {
            Self::JsonSchema(_) | Self::JsonObject => GrammarKind::JsonSchema,
            Self::Lark(_) => GrammarKind::Lark,
            Self::Regex(_) => GrammarKind::Regex,
        }
    }

    /// The size of the grammar's source in bytes (a schema as compact JSON).
    pub fn source_len(&self) -> usize {
        match self {
            Self::JsonSchema(schema) => schema.to_string().len(),
            Self::JsonObject => 0,
            Self::Lark(text) | Self::Regex(text) => text.len(),
        }
    }

    /// llguidance's form of the grammar.
    pub(crate) fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({ "type": "object" }))
            }
            Self::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }
}
