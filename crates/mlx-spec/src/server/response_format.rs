//! `response_format`: OpenAI's `text`, `json_object` and `json_schema`,
//! and our extensions `regex` and `grammar` (a Lark grammar, llguidance's
//! syntax). Parsed and checked here, before anything is queued; what it
//! asks for is a [`GrammarSpec`], which the grammar crate compiles against
//! the model's vocabulary into the request's constraint.

use serde_json::Value;

use super::api::ApiError;
use crate::grammar::{GrammarSpec, TokenEnv};

/// The longest grammar, regex or serialized schema a request may send.
pub const MAX_FORMAT_BYTES: usize = 64 * 1024;

/// A request's `response_format`.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// `json_object`, `json_schema`, `regex` or `grammar`.
    Constrained {
        /// The `type` it came as, for messages.
        kind: &'static str,
        /// The schema's `name` (`json_schema` only).
        name: Option<String>,
        /// `strict` as sent (`json_schema` only); the output always
        /// follows the schema, strict or not.
        strict: Option<bool>,
        spec: GrammarSpec,
    },
}

const PARAM: Option<&'static str> = Some("response_format");

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid(message, PARAM)
}

/// A required string field of `format`, at most [`MAX_FORMAT_BYTES`].
fn text_field(
    format: &serde_json::Map<String, Value>,
    kind: &str,
    key: &str,
) -> Result<String, ApiError> {
    match format.get(key) {
        Some(Value::String(s)) if s.is_empty() => Err(invalid(format!(
            "`response_format.{key}` must not be empty (type `{kind}`)"
        ))),
        Some(Value::String(s)) if s.len() > MAX_FORMAT_BYTES => Err(invalid(format!(
            "`response_format.{key}` is {} bytes, over the limit of {MAX_FORMAT_BYTES}",
            s.len()
        ))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(invalid(format!("`response_format.{key}` must be a string"))),
        None => Err(invalid(format!(
            "`response_format` of type `{kind}` needs the field `{key}`"
        ))),
    }
}

impl ResponseFormat {
    /// Parses the field as sent (`None`: absent or `null`, free text).
    pub fn parse(value: Option<&Value>) -> Result<Self, ApiError> {
        let format = match value {
            None | Some(Value::Null) => return Ok(Self::Text),
            Some(Value::Object(format)) => format,
            Some(_) => return Err(invalid("`response_format` must be an object with a `type`")),
        };
        let kind = match format.get("type") {
            Some(Value::String(kind)) => kind.as_str(),
            Some(_) => return Err(invalid("`response_format.type` must be a string")),
            None => return Err(invalid("`response_format` needs the field `type`")),
        };
        let constrained = |kind, spec| Self::Constrained {
            kind,
            name: None,
            strict: None,
            spec,
        };
        match kind {
            "text" => Ok(Self::Text),
            "json_object" => Ok(constrained("json_object", GrammarSpec::JsonObject)),
            "regex" => Ok(constrained(
                "regex",
                GrammarSpec::Regex(text_field(format, kind, "regex")?),
            )),
            "grammar" => Ok(constrained(
                "grammar",
                GrammarSpec::Lark(text_field(format, kind, "grammar")?),
            )),
            "json_schema" => Self::json_schema(format.get("json_schema")),
            other => Err(invalid(format!(
                "unsupported `response_format.type` `{other}` (text, json_object, json_schema, regex or grammar)"
            ))),
        }
    }

    fn json_schema(field: Option<&Value>) -> Result<Self, ApiError> {
        let Some(field) = field else {
            return Err(invalid(
                "`response_format` of type `json_schema` needs the field `json_schema`",
            ));
        };
        let Value::Object(field) = field else {
            return Err(invalid("`response_format.json_schema` must be an object"));
        };
        let name =
            match field.get("name") {
                Some(Value::String(n))
                    if !n.is_empty()
                        && n.len() <= 64
                        && n.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
                {
                    n.clone()
                }
                Some(_) => return Err(invalid(
                    "`response_format.json_schema.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
                )),
                None => {
                    return Err(invalid(
                        "`response_format.json_schema` needs the field `name`",
                    ))
                }
            };
        let strict = match field.get("strict") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                return Err(invalid(
                    "`response_format.json_schema.strict` must be a boolean",
                ))
            }
        };
        let schema = match field.get("schema") {
            Some(schema @ (Value::Object(_) | Value::Bool(_))) => schema.clone(),
            Some(_) => {
                return Err(invalid(
                    "`response_format.json_schema.schema` must be a JSON Schema (an object)",
                ))
            }
            // OpenAI's default: any JSON object.
            None => {
                return Ok(Self::Constrained {
                    kind: "json_schema",
                    name: Some(name),
                    strict,
                    spec: GrammarSpec::JsonObject,
                })
            }
        };
        let size = serde_json::to_string(&schema).map_or(usize::MAX, |s| s.len());
        if size > MAX_FORMAT_BYTES {
            return Err(invalid(format!(
                "`response_format.json_schema.schema` is {size} bytes, over the limit of {MAX_FORMAT_BYTES}"
            )));
        }
        Ok(Self::Constrained {
            kind: "json_schema",
            name: Some(name),
            strict,
            spec: GrammarSpec::JsonSchema(schema),
        })
    }

    /// The `type` it came as.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Constrained { kind, .. } => kind,
        }
    }

    /// The grammar to compile, `None` for free text.
    pub fn grammar(&self) -> Option<&GrammarSpec> {
        match self {
            Self::Text => None,
            Self::Constrained { spec, .. } => Some(spec),
        }
    }
}

/// The constraint a request's `response_format` asks for, compiled
/// against the model's vocabulary (`env`, or why the model has none):
/// `None` for free text, a 400 naming the problem (for a JSON schema, the
/// subschema at fault where it can be found) for a schema, grammar or
/// regex the grammar engine refuses or finds too complex. Runs before the
/// request joins the engine, off the async workers (compiling a large
/// grammar takes a while).
pub fn constraint_of(
    env: Result<&TokenEnv, &str>,
    format: &ResponseFormat,
) -> Result<Option<Box<dyn spec_core::Constraint>>, ApiError> {
    let Some(spec) = format.grammar() else {
        return Ok(None);
    };
    let env = env.map_err(|reason| {
        invalid(format!(
            "`response_format` of type `{}` cannot be served: this model has no constrained decoding ({reason})",
            format.kind()
        ))
    })?;
    crate::grammar::compile(env, spec)
        .map(Some)
        .map_err(|e| invalid(format!("`response_format` ({}): {e}", format.kind())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<ResponseFormat, ApiError> {
        ResponseFormat::parse(Some(&v))
    }

    #[test]
    fn openai_formats_and_our_extensions_parse() {
        assert_eq!(
            ResponseFormat::parse(None).expect("absent"),
            ResponseFormat::Text
        );
        assert_eq!(
            parse(json!({"type": "text"})).expect("text"),
            ResponseFormat::Text
        );
        assert_eq!(
            parse(json!({"type": "json_object"}))
                .expect("object")
                .grammar(),
            Some(&GrammarSpec::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        match parse(json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": true}}))
            .expect("schema")
        {
            ResponseFormat::Constrained {
                kind,
                name,
                strict,
                spec,
            } => {
                assert_eq!((kind, name.as_deref(), strict), ("json_schema", Some("thing"), Some(true)));
                assert_eq!(spec, GrammarSpec::JsonSchema(schema));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(json!({"type": "regex", "regex": "[0-9]+"}))
                .expect("regex")
                .grammar(),
            Some(&GrammarSpec::Regex("[0-9]+".into()))
        );
        assert_eq!(
            parse(json!({"type": "grammar", "grammar": "start: \"a\"+"}))
                .expect("lark")
                .grammar(),
            Some(&GrammarSpec::Lark("start: \"a\"+".into()))
        );
    }

    #[test]
    fn bad_formats_are_400s_naming_what_is_wrong() {
        for (body, names) in [
            (json!("json"), "must be an object"),
            (json!({}), "needs the field `type`"),
            (
                json!({"type": 3}),
                "`response_format.type` must be a string",
            ),
            (
                json!({"type": "xml"}),
                "unsupported `response_format.type` `xml`",
            ),
            (
                json!({"type": "json_schema"}),
                "needs the field `json_schema`",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}}}),
                "needs the field `name`",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
                "json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}}),
                "json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}),
                "json_schema.strict",
            ),
            (json!({"type": "regex"}), "needs the field `regex`"),
            (
                json!({"type": "regex", "regex": ""}),
                "`response_format.regex` must not be empty",
            ),
            (
                json!({"type": "grammar", "grammar": 1}),
                "`response_format.grammar` must be a string",
            ),
            (
                json!({"type": "grammar", "grammar": "x".repeat(MAX_FORMAT_BYTES + 1)}),
                "over the limit",
            ),
        ] {
            let err = parse(body.clone()).expect_err("must be refused");
            assert_eq!(
                (err.status.as_u16(), err.param),
                (400, Some("response_format")),
                "{body}"
            );
            assert!(err.message.contains(names), "{body}: {}", err.message);
        }
    }
}
