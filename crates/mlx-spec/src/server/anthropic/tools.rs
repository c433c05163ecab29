//! `tools` and `tool_choice` of a Messages request: custom tools with an
//! object `input_schema`, names unique; a choice of `auto`, `any`, `tool`
//! (naming a declared tool) or `none`, and `disable_parallel_tool_use`.

use serde_json::{json, Value};
use spec_agent::{Tool, ToolChoice};

use super::content::invalid;
use crate::server::api::ApiError;

/// `tools`: custom tools only, each with a name, an optional description
/// and an object `input_schema`.
pub(super) fn tools(field: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    let list = match field {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("tools", "tools", "must be a list of tools")),
    };
    let mut out: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let Some(tool) = tool.as_object() else {
            return Err(invalid("tools", &path, "must be an object"));
        };
        match tool.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "custom" => {}
            Some(other) => {
                return Err(invalid(
                    "tools",
                    &format!("{path}.type"),
                    &format!("{other} is not supported: this server runs custom tools only (no server tools)"),
                ))
            }
        }
        // Names and their uniqueness follow the rule both APIs share
        // (`spec_agent::check_tools`, run on the translated tools).
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            return Err(invalid(
                "tools",
                &format!("{path}.name"),
                "field required (a string)",
            ));
        };
        let name = name.to_owned();
        let description = match tool.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => {
                return Err(invalid(
                    "tools",
                    &format!("{path}.description"),
                    "must be a string",
                ))
            }
        };
        let parameters = input_schema(tool.get("input_schema"), &format!("{path}.input_schema"))?;
        out.push(Tool {
            name,
            description,
            parameters,
        });
    }
    Ok(out)
}

/// An `input_schema`: a JSON schema of `type: "object"` whose
/// `properties`, when an object, hold schemas.
/// Whether the grammar engine takes the rest is checked when the output
/// grammar compiles (a 400 naming the tool).
fn input_schema(field: Option<&Value>, path: &str) -> Result<Value, ApiError> {
    let bad = |what: &str| invalid("tools", path, what);
    let Some(Value::Object(schema)) = field else {
        return Err(bad("field required (a JSON schema object)"));
    };
    if schema.get("type") != Some(&json!("object")) {
        return Err(bad("must have `type: \"object\"`"));
    }
    // `properties` and `required` themselves are `check_tools`' to judge.
    if let Some(Value::Object(props)) = schema.get("properties") {
        if let Some((key, _)) = props
            .iter()
            .find(|(_, s)| !(s.is_object() || s.is_boolean()))
        {
            return Err(invalid(
                "tools",
                &format!("{path}.properties.{key}"),
                "must be a JSON schema (an object)",
            ));
        }
    }
    Ok(Value::Object(schema.clone()))
}

/// `tool_choice` and whether several calls may come at once.
pub(super) fn tool_choice(
    field: Option<&Value>,
    tools: &[Tool],
) -> Result<(ToolChoice, bool), ApiError> {
    let Some(choice) = field.filter(|v| !v.is_null()) else {
        return Ok((ToolChoice::Auto, true));
    };
    let bad = |path: &str, what: &str| invalid("tool_choice", path, what);
    let Some(object) = choice.as_object() else {
        return Err(bad("tool_choice", "must be an object with a `type`"));
    };
    let parallel = match object.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(disable)) => !disable,
        Some(_) => {
            return Err(bad(
                "tool_choice.disable_parallel_tool_use",
                "must be a boolean",
            ))
        }
    };
    let kind = object.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad(
            "tool_choice.type",
            "field required (auto, any, tool or none)",
        )
    })?;
    let needs_tools = |kind: &str| {
        if tools.is_empty() {
            Err(bad("tool_choice", &format!("`{kind}` needs `tools`")))
        } else {
            Ok(())
        }
    };
    let choice = match kind {
        "auto" => ToolChoice::Auto,
        "none" => ToolChoice::None,
        "any" => {
            needs_tools(kind)?;
            ToolChoice::Required
        }
        "tool" => {
            needs_tools(kind)?;
            let name = object
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice.name", "field required (a tool's name)"))?;
            if !tools.iter().any(|t| t.name == name) {
                let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                return Err(bad(
                    "tool_choice.name",
                    &format!("no tool named `{name}` in `tools` ({})", names.join(", ")),
                ));
            }
            ToolChoice::Named(name.to_owned())
        }
        other => {
            return Err(bad(
                "tool_choice.type",
                &format!("unknown type `{other}` (auto, any, tool or none)"),
            ))
        }
    };
    Ok((choice, parallel))
}
