//! What a request asks its output to match, and the JSON layout a JSON
//! constraint gets unless its schema names one.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Map, Value};

/// The key of a JSON schema under which llguidance reads its own options
/// (the layout among them).
pub const LAYOUT_KEY: &str = "x-guidance";

/// The layout of JSON constraints whose schema names none: Python's
/// `json.dumps` (`", "` between items, `": "` after keys, no other
/// whitespace), llguidance's options under [`LAYOUT_KEY`]. With no free
/// whitespace every separator and key is forced, so forced-token drafts
/// cover them; a schema with its own `x-guidance` object keeps it (e.g.
/// `{"whitespace_flexible": true}` for llguidance's flexible layout).
pub fn json_dumps_layout() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": "
    })
}

/// `schema` as a JSON constraint compiles it: with [`json_dumps_layout`]
/// under [`LAYOUT_KEY`] unless it has a layout of its own. The schema
/// `true` becomes `{}` with the layout; any other non-object schema is
/// returned as it is (llguidance judges it).
pub fn with_default_layout(schema: Value) -> Value {
    let mut object = match schema {
        Value::Object(object) => object,
        Value::Bool(true) => Map::new(),
        other => return other,
    };
    object.entry(LAYOUT_KEY).or_insert_with(json_dumps_layout);
    Value::Object(object)
}

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

    /// The JSON schema llguidance compiles for a JSON constraint (the
    /// request's, or `{"type": "object"}` for any object, laid out by
    /// [`with_default_layout`]); `None` for a Lark grammar or a regex. An
    /// oracle driving llguidance elsewhere compiles this to build the same
    /// grammar.
    pub fn effective_schema(&self) -> Option<Value> {
        match self {
            Self::JsonSchema(schema) => Some(with_default_layout(schema.clone())),
            Self::JsonObject => Some(with_default_layout(any_object())),
            Self::Lark(_) | Self::Regex(_) => None,
        }
    }

    /// llguidance's form of the grammar.
    pub(crate) fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_default_layout(schema.clone()))
            }
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(with_default_layout(any_object()))
            }
            Self::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }
}

/// The schema of any JSON object.
fn any_object() -> Value {
    json!({ "type": "object" })
}
