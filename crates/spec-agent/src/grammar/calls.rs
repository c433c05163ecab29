//! Each format's call syntax as grammar rules: what follows the open marker
//! for a call of one tool, written as the model's own chat template writes
//! an assistant's call, with the arguments valid under the tool's schema.

use serde_json::{json, Value};

use super::lark::{quote, Lark, WS};
use super::{gemma, harmony};
use crate::tools::schema_type;
use crate::{Tool, ToolFormat};

/// The text that opens a call in `format`, if one does.
pub(super) fn open_marker(format: ToolFormat) -> Option<&'static str> {
    match format {
        ToolFormat::Hermes | ToolFormat::Qwen3Coder | ToolFormat::Glm45 => Some("<tool_call>"),
        ToolFormat::Mistral => Some("[TOOL_CALLS]"),
        ToolFormat::Gemma4 => Some("<|tool_call>"),
        // Llama's calls open with their JSON; harmony's are whole messages
        // (`harmony.rs`).
        ToolFormat::Llama3Json | ToolFormat::Harmony => None,
    }
}

/// One call of one of `tools`, after the open marker (the whole call for
/// Llama); with `parallel`, Mistral's array may hold several.
pub(super) fn call_rest(
    g: &mut Lark,
    format: ToolFormat,
    tools: &[&Tool],
    parallel: bool,
) -> String {
    if format == ToolFormat::Mistral {
        return mistral(g, tools, parallel);
    }
    let calls: Vec<String> = tools.iter().map(|tool| one_call(g, format, tool)).collect();
    g.rule("call", "", &calls.join(" | "))
}

fn one_call(g: &mut Lark, format: ToolFormat, tool: &Tool) -> String {
    let name = &tool.name;
    match format {
        ToolFormat::Hermes => {
            let call = g.call_json(&named_object(name, "arguments", &tool.parameters));
            format!("\"\\n\" {call} \"\\n\" {}", g.lit("</tool_call>"))
        }
        ToolFormat::Llama3Json => g.call_json(&named_object(name, "parameters", &tool.parameters)),
        ToolFormat::Qwen3Coder => {
            let mut parts = vec![g.lit(&format!("\n<function={name}>\n"))];
            for (param, schema, required) in tool.properties() {
                let value = bare_value(
                    g,
                    &with_definitions(schema, &tool.parameters),
                    "\n</parameter>\n",
                );
                let item = format!("{} {value}", g.lit(&format!("<parameter={param}>\n")));
                parts.push(if required { item } else { format!("({item})?") });
            }
            parts.push(g.lit("</function>\n</tool_call>"));
            parts.join(" ")
        }
        ToolFormat::Glm45 => {
            // GLM-4.5 and 4.6 put each part on a line of its own, GLM-4.7
            // and 5 write them together: whitespace between parts is free.
            let mut parts = vec![quote(name), format!("{WS}?")];
            for (param, schema, required) in tool.properties() {
                let value = bare_value(
                    g,
                    &with_definitions(schema, &tool.parameters),
                    "</arg_value>",
                );
                let item = format!(
                    "{} {WS}? {} {value} {WS}?",
                    g.lit(&format!("<arg_key>{param}</arg_key>")),
                    g.lit("<arg_value>"),
                );
                parts.push(if required { item } else { format!("({item})?") });
            }
            parts.push(g.lit("</tool_call>"));
            parts.join(" ")
        }
        ToolFormat::Gemma4 => {
            let arguments = gemma::arguments(g, &tool.parameters);
            format!(
                "{} {arguments} {}",
                quote(&format!("call:{name}")),
                g.lit("<tool_call|>")
            )
        }
        ToolFormat::Mistral => mistral(g, &[tool], false),
        ToolFormat::Harmony => harmony::call(g, tool),
    }
}

/// `{"name": NAME, KEY: <arguments>}`, nothing else.
/// The parameters' definitions (`$defs`, `definitions`) move to the
/// wrapper's root, where their `#/$defs/..` references resolve.
fn named_object(name: &str, key: &str, parameters: &Value) -> Value {
    let mut parameters = parameters.clone();
    let mut object = json!({
        "type": "object",
        "properties": {"name": {"const": name}},
        "required": ["name", key],
        "additionalProperties": false,
    });
    for defs in DEFINITIONS {
        if let Some(found) = parameters.as_object_mut().and_then(|p| p.remove(defs)) {
            object[defs] = found;
        }
    }
    object["properties"][key] = parameters;
    object
}

/// Where JSON schemas keep the definitions their references point into.
const DEFINITIONS: [&str; 2] = ["$defs", "definitions"];

/// `schema` (a part of `root`) with `root`'s definitions beside it, so its
/// references still resolve when it is compiled on its own.
fn with_definitions(schema: &Value, root: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        for defs in DEFINITIONS {
            if let Some(found) = root.get(defs) {
                object.entry(defs).or_insert_with(|| found.clone());
            }
        }
    }
    schema
}

/// A value written bare up to `end` (which it includes): a string
/// parameter as free text (or one of its `enum`), anything else as JSON.
fn bare_value(g: &mut Lark, schema: &Value, end: &str) -> String {
    if schema_type(schema) == Some("boolean") {
        // Templates that write `value | string` spell Python's `True`.
        return format!(
            "(\"true\" | \"false\" | \"True\" | \"False\") {}",
            g.lit(end)
        );
    }
    if schema_type(schema) != Some("string") {
        let value = g.call_json(schema);
        return format!("{value} {}", g.lit(end));
    }
    match schema.get("enum").and_then(Value::as_array) {
        Some(options) => {
            let options: Vec<String> = options
                .iter()
                .filter_map(Value::as_str)
                .map(quote)
                .collect();
            format!("({}) {}", options.join(" | "), g.lit(end))
        }
        None => g.text_through(end),
    }
}

/// Mistral's calls after `[TOOL_CALLS]`: the JSON array
/// `[{"name", "arguments", "id"?}, ..]` or `name([CALL_ID]id)?[ARGS]{..}` (several,
/// each after its own `[TOOL_CALLS]`, when parallel).
fn mistral(g: &mut Lark, tools: &[&Tool], parallel: bool) -> String {
    let objects: Vec<Value> = tools
        .iter()
        .map(|tool| {
            let mut object = named_object(&tool.name, "arguments", &tool.parameters);
            object["properties"]["id"] = json!({"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"});
            object
        })
        .collect();
    let mut array = json!({"type": "array", "minItems": 1});
    // Each object's definitions move up to the array, the document's root.
    let mut objects = objects;
    for defs in DEFINITIONS {
        let mut merged = serde_json::Map::new();
        for object in &mut objects {
            if let Some(Value::Object(found)) = object.as_object_mut().and_then(|o| o.remove(defs))
            {
                merged.extend(found);
            }
        }
        if !merged.is_empty() {
            array[defs] = Value::Object(merged);
        }
    }
    array["items"] = json!({"anyOf": objects});
    if !parallel {
        array["maxItems"] = json!(1);
    }
    let array = g.call_json(&array);
    let args = g.lit("[ARGS]");
    // Models whose template writes `[CALL_ID]` may write an id before the arguments.
    let call_id = format!("({} /[a-zA-Z0-9]{{9}}/)?", g.lit("[CALL_ID]"));
    let named: Vec<String> = tools
        .iter()
        .map(|tool| {
            format!(
                "{} {call_id} {args} {}",
                quote(&tool.name),
                g.call_json(&tool.parameters)
            )
        })
        .collect();
    let named = g.rule("named", "", &named.join(" | "));
    let more = if parallel {
        format!(" ({} {named})*", g.lit("[TOOL_CALLS]"))
    } else {
        String::new()
    };
    format!("({WS}? {array} | {named}{more})")
}
