//! The tools a request declares, the caller's choice among them, and the
//! system text that describes them to a model whose template knows no tools.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::AgentError;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name, as the model writes it in a call.
    pub name: String,
    /// What the function does, for the model.
    pub description: Option<String>,
    /// The JSON schema of the call's arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// The tool in the OpenAI/transformers shape chat templates read:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn openai_json(&self) -> Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::from(self.name.as_str()));
        if let Some(description) = &self.description {
            function.insert("description".into(), Value::from(description.as_str()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": function})
    }

    /// The schema of argument `name`, if the parameters declare it.
    pub(crate) fn property(&self, name: &str) -> Option<&Value> {
        self.parameters.get("properties")?.get(name)
    }

    /// The declared properties in schema order, each with whether it is required.
    pub(crate) fn properties(&self) -> Vec<(&str, &Value, bool)> {
        let required: BTreeSet<&str> = self
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        self.parameters
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| {
                props
                    .iter()
                    .map(|(name, schema)| (name.as_str(), schema, required.contains(name.as_str())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The tool in `tools` named `name`.
pub(crate) fn find<'a>(tools: &'a [Tool], name: &str) -> Option<&'a Tool> {
    tools.iter().find(|tool| tool.name == name)
}

/// The JSON schema type of a property: its `type` (the first non-null
/// entry of a type list), the one non-null type of its `anyOf`/`oneOf`
/// alternatives (pydantic's `Optional[str]`), or `string` for an enum of
/// strings.
pub(crate) fn schema_type(schema: &Value) -> Option<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => return Some(t),
        Some(Value::Array(types)) => {
            return types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
        }
        _ => {}
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        return options.iter().all(Value::is_string).then_some("string");
    }
    let alternatives = ["anyOf", "oneOf"]
        .iter()
        .find_map(|key| schema.get(*key)?.as_array())?;
    let mut types = alternatives
        .iter()
        .map(schema_type)
        .filter(|t| *t != Some("null"));
    let first = types.next()??;
    types.all(|t| t == Some(first)).then_some(first)
}

/// Which calls a response must or may make (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides: prose, calls, or both.
    #[default]
    Auto,
    /// No calls: the tools are described but never called.
    None,
    /// At least one call, of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

impl ToolChoice {
    /// The choice as OpenAI's API spells it, for messages.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Auto => "auto",
            Self::None => "none",
            Self::Required => "required",
            Self::Named(name) => name,
        }
    }
}

/// Checks what calls and grammars rely on: names of 1 to 64 ASCII letters,
/// digits, `_`, `-` or `.`, no two alike, and `parameters` a JSON object
/// (a schema) whose `properties`, when present, is an object.
pub fn check_tools(tools: &[Tool]) -> Result<(), AgentError> {
    let mut seen = BTreeSet::new();
    for (index, tool) in tools.iter().enumerate() {
        let name = &tool.name;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid {
            return Err(AgentError::BadToolName {
                index,
                name: name.clone(),
            });
        }
        if !seen.insert(name.as_str()) {
            return Err(AgentError::DuplicateTool {
                index,
                name: name.clone(),
            });
        }
        let bad = |message: &str| AgentError::BadParameters {
            index,
            name: name.clone(),
            message: message.to_owned(),
        };
        let Some(schema) = tool.parameters.as_object() else {
            return Err(bad("must be a JSON schema object"));
        };
        if schema.get("properties").is_some_and(|p| !p.is_object()) {
            return Err(bad("`properties` must be an object"));
        }
        if schema.get("required").is_some_and(|r| !r.is_array()) {
            return Err(bad("`required` must be an array of names"));
        }
    }
    Ok(())
}

/// The system text that teaches a model whose chat template ignores `tools`
/// (e.g. SmolLM2's ChatML) to call them: each tool's JSON on a line of its
/// own, then the `<tool_call>` JSON syntax the fallback (Hermes) parser
/// reads. The server prepends it to the first system message (or adds one).
pub fn fallback_tools_prompt(tools: &[Tool]) -> String {
    let mut text = String::from(
        "You can call functions to help with the user's request. \
         These are the functions, one JSON object per line:\n<tools>\n",
    );
    for tool in tools {
        // A Value always serializes.
        let _ = writeln!(text, "{}", tool.openai_json());
    }
    text.push_str(
        "</tools>\n\nTo call a function, write one JSON object with its name and its \
         arguments between <tool_call> and </tool_call>, like this:\n\
         <tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>\n\
         Write one such block per call, and nothing after the last one.",
    );
    text
}

/// One call as the fallback (Hermes) syntax writes it, the layout the
/// fallback prompt teaches and the grammar enforces:
/// `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`, JSON as
/// Python's `json.dumps` spaces it. A server writes earlier calls into a
/// tool-less template's history with it, so the history matches what the
/// model generated.
pub fn fallback_call_text(name: &str, arguments: &Value) -> String {
    let call = json!({"name": name, "arguments": arguments});
    format!(
        "<tool_call>\n{}\n</tool_call>",
        spec_text::python_json(&call)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: Value) -> Tool {
        Tool {
            name: name.into(),
            description: Some("d".into()),
            parameters,
        }
    }

    #[test]
    fn openai_json_keeps_the_transformers_shape() {
        let t = tool("get_weather", json!({"type": "object"}));
        assert_eq!(
            t.openai_json().to_string(),
            r#"{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"}}}"#
        );
    }

    #[test]
    fn check_tools_names_the_bad_tool() {
        let ok = tool("a.b-c_1", json!({"type": "object", "properties": {}}));
        assert_eq!(check_tools(std::slice::from_ref(&ok)), Ok(()));
        let err = check_tools(&[ok.clone(), tool("bad name", json!({}))]).expect_err("space");
        assert_eq!(
            err,
            AgentError::BadToolName {
                index: 1,
                name: "bad name".into()
            }
        );
        let err = check_tools(&[ok.clone(), ok.clone()]).expect_err("duplicate");
        assert!(
            err.to_string().contains("tools[1].name \"a.b-c_1\""),
            "{err}"
        );
        let err = check_tools(&[tool("f", json!("object"))]).expect_err("not a schema");
        assert!(
            err.to_string().starts_with("tools[0] (f).parameters"),
            "{err}"
        );
        let err = check_tools(&[tool("f", json!({"properties": []}))]).expect_err("properties");
        assert!(err.to_string().contains("`properties`"), "{err}");
    }

    #[test]
    fn schema_types_look_through_optional_and_enums() {
        assert_eq!(schema_type(&json!({"type": "integer"})), Some("integer"));
        assert_eq!(
            schema_type(&json!({"type": ["null", "string"]})),
            Some("string")
        );
        let optional = json!({"anyOf": [{"type": "string"}, {"type": "null"}]});
        assert_eq!(schema_type(&optional), Some("string"));
        assert_eq!(
            schema_type(&json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})),
            None
        );
        assert_eq!(schema_type(&json!({"enum": ["a", "b"]})), Some("string"));
        assert_eq!(schema_type(&json!({"enum": ["a", 1]})), None);
        assert_eq!(schema_type(&json!({"$ref": "#/$defs/X"})), None);
    }

    #[test]
    fn the_fallback_prompt_lists_every_tool_and_the_syntax() {
        let tools = [
            tool("get_weather", json!({"type": "object"})),
            tool("add", json!({"type": "object"})),
        ];
        let text = fallback_tools_prompt(&tools);
        for t in &tools {
            assert!(text.contains(&t.openai_json().to_string()), "{text}");
        }
        assert!(text.contains("<tool_call>\n{\"name\""), "{text}");
    }
}
