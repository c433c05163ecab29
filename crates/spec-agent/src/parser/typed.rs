//! Argument values written as bare text (Qwen3-Coder's and GLM's
//! parameters) turned into JSON by the tool's schema: a string parameter
//! stays text, numbers, booleans, objects and arrays are parsed.

use serde_json::Value;

use crate::tools::{find, schema_type};
use crate::Tool;

/// The JSON value of argument `param` of tool `name`, written as `text`.
pub(crate) fn argument(tools: &[Tool], name: &str, param: &str, text: &str) -> Value {
    let schema = find(tools, name).and_then(|tool| tool.property(param));
    typed(text, schema.and_then(schema_type))
}

/// `text` as a value of JSON schema type `ty`; text that does not parse as
/// the type stays a string (the caller's schema check, if any, decides).
fn typed(text: &str, ty: Option<&str>) -> Value {
    let string = || Value::String(text.to_owned());
    let parsed = || serde_json::from_str::<Value>(text.trim()).ok();
    match ty {
        Some("string") => string(),
        Some("integer" | "number") => parsed().filter(Value::is_number).unwrap_or_else(string),
        Some("boolean") => match text.trim().to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => string(),
        },
        Some("null") if matches!(text.trim(), "null" | "None") => Value::Null,
        Some("object") => parsed().filter(Value::is_object).unwrap_or_else(string),
        Some("array") => parsed().filter(Value::is_array).unwrap_or_else(string),
        // Untyped: JSON when it is JSON, text otherwise.
        _ => parsed().unwrap_or_else(string),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_follow_the_schema_type() {
        assert_eq!(typed("42", Some("string")), json!("42"));
        assert_eq!(typed("42", Some("integer")), json!(42));
        assert_eq!(typed("2.5", Some("number")), json!(2.5));
        assert_eq!(typed("True", Some("boolean")), json!(true));
        assert_eq!(typed("{\"a\": [1]}", Some("object")), json!({"a": [1]}));
        assert_eq!(typed("[1, 2]", Some("array")), json!([1, 2]));
        assert_eq!(typed("many", Some("integer")), json!("many"));
        assert_eq!(typed("Paris", None), json!("Paris"));
        assert_eq!(typed("7", None), json!(7));
    }
}
