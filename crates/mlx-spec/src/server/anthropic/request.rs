//! A Messages request, checked field by field before anything reaches the
//! engine, and translated into the chat pipeline's [`ChatTurn`] and the
//! generation fields the OpenAI routes use ([`Common`]): `tools` and
//! `tool_choice` into the agent's tools, `thinking` into the template's
//! `enable_thinking`, `output_config.format` into a `json_schema`
//! `response_format`, `stop_sequences` into `stop`; `temperature`,
//! `top_p`, `top_k` (which older clients send) and our `speculative` and
//! `cache_salt` pass through.

use serde::Deserialize;
use serde_json::{json, Map, Value};
use spec_agent::{Tool, ToolChoice};

use super::content::{self, invalid};
use crate::server::api::{ApiError, Common, SpecField};
use crate::server::chat_turn::ChatTurn;

/// The fields this server reads; others (`metadata` beyond its check,
/// `service_tier`, `cache_control`...) are accepted and ignored.
#[derive(Debug, Deserialize, Default)]
pub struct MessagesRequest {
    pub model: Option<Value>,
    pub max_tokens: Option<Value>,
    pub messages: Option<Value>,
    pub system: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    pub output_config: Option<Value>,
    pub stop_sequences: Option<Value>,
    pub stream: Option<Value>,
    pub metadata: Option<Value>,
    pub temperature: Option<Value>,
    pub top_p: Option<Value>,
    pub top_k: Option<Value>,
    /// Our extension, as on the OpenAI routes.
    pub speculative: Option<Value>,
    /// Our extension, as on the OpenAI routes.
    pub cache_salt: Option<Value>,
}

/// Which route a request came to: `count_tokens` needs no `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Messages,
    CountTokens,
}

/// The most stop sequences a request may send (the server's limit).
const MAX_STOP_SEQUENCES: usize = 4;

/// The request as the chat pipeline takes it.
pub fn translate(req: &MessagesRequest, route: Route) -> Result<(ChatTurn, Common), ApiError> {
    let model = match &req.model {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(invalid("model", "model", "must be a string")),
        None => return Err(invalid("model", "model", "field required")),
    };
    let mut common = Map::new();
    common.insert("model".into(), json!(model));
    match (&req.max_tokens, route) {
        (None | Some(Value::Null), Route::Messages) => {
            return Err(invalid("max_tokens", "max_tokens", "field required"))
        }
        (None | Some(Value::Null), Route::CountTokens) => {}
        (Some(v), _) => match v.as_i64() {
            Some(n) if n >= 1 => {
                common.insert("max_tokens".into(), json!(n));
            }
            _ => {
                return Err(invalid(
                    "max_tokens",
                    "max_tokens",
                    "must be an integer of at least 1",
                ))
            }
        },
    }
    let tools = tools(req.tools.as_ref())?;
    // The rule both APIs share (names, schema shapes the grammar takes).
    spec_agent::check_tools(&tools).map_err(|e| crate::server::chat_turn::agent_error(&e))?;
    let (tool_choice, parallel_tool_calls) = tool_choice(req.tool_choice.as_ref(), &tools)?;
    let mut template_kwargs = Map::new();
    if let Some(enable) = thinking(req.thinking.as_ref(), common.get("max_tokens"))? {
        template_kwargs.insert("enable_thinking".into(), json!(enable));
    }
    if let Some(format) = output_format(req.output_config.as_ref())? {
        common.insert("response_format".into(), format);
    }
    if let Some(stop) = stop_sequences(req.stop_sequences.as_ref())? {
        common.insert("stop".into(), stop);
    }
    match &req.stream {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            common.insert("stream".into(), json!(b));
        }
        Some(_) => return Err(invalid("stream", "stream", "must be a boolean")),
    }
    match &req.metadata {
        None | Some(Value::Null) => {}
        Some(Value::Object(m))
            if matches!(
                m.get("user_id"),
                None | Some(Value::Null | Value::String(_))
            ) => {}
        Some(_) => {
            return Err(invalid(
                "metadata",
                "metadata",
                "must be an object whose `user_id` is a string",
            ))
        }
    }
    // Anthropic's ranges; the server's own checks follow in `Common`.
    for (name, value, upper) in [
        ("temperature", &req.temperature, 1.0),
        ("top_p", &req.top_p, 1.0),
    ] {
        match value {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_f64() {
                Some(x) if (0.0..=upper).contains(&x) => {
                    common.insert(name.into(), json!(x));
                }
                _ => return Err(invalid(name, name, "must be a number from 0 to 1")),
            },
        }
    }
    match &req.top_k {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_i64() {
            Some(k) if k >= 0 => {
                common.insert("top_k".into(), json!(k));
            }
            _ => return Err(invalid("top_k", "top_k", "must be a non-negative integer")),
        },
    }
    if let Some(spec) = req.speculative.as_ref().filter(|v| !v.is_null()) {
        serde_json::from_value::<SpecField>(spec.clone()).map_err(|_| {
            invalid(
                "speculative",
                "speculative",
                "must be false or an object naming a loaded `provider`",
            )
        })?;
        common.insert("speculative".into(), spec.clone());
    }
    match &req.cache_salt {
        None | Some(Value::Null) => {}
        Some(salt @ Value::String(_)) => {
            common.insert("cache_salt".into(), salt.clone());
        }
        Some(_) => return Err(invalid("cache_salt", "cache_salt", "must be a string")),
    }
    // Every field was checked above: a failure here is the server's own.
    let common: Common = serde_json::from_value(Value::Object(common))
        .map_err(|e| ApiError::internal(format!("translating the request failed: {e}")))?;
    let system = content::system(req.system.as_ref())?;
    let messages = content::messages(req.messages.as_ref(), system)?;
    let turn = ChatTurn {
        tools,
        tool_choice,
        parallel_tool_calls,
        template_kwargs,
        ..ChatTurn::new(messages)
    };
    Ok((turn, common))
}

/// A tool name as Anthropic allows it.
fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `tools`: custom tools only, each with a name, an optional description
/// and an object `input_schema`; names unique.
fn tools(field: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
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
        let name = match tool.get("name") {
            Some(Value::String(n)) if valid_name(n) => n.clone(),
            Some(Value::String(n)) => {
                return Err(invalid(
                    "tools",
                    &format!("{path}.name"),
                    &format!("`{n}` must be 1 to 128 of a-z, A-Z, 0-9, _ and -"),
                ))
            }
            _ => {
                return Err(invalid(
                    "tools",
                    &format!("{path}.name"),
                    "field required (a string)",
                ))
            }
        };
        if out.iter().any(|t| t.name == name) {
            return Err(invalid(
                "tools",
                &format!("{path}.name"),
                &format!("`{name}` names an earlier tool too"),
            ));
        }
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

/// An `input_schema`: a JSON schema of `type: "object"`, its `properties`
/// an object of schemas and its `required` a list of strings when given.
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
    match schema.get("properties") {
        None => {}
        Some(Value::Object(props)) => {
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
        Some(_) => return Err(bad("`properties` must be an object")),
    }
    match schema.get("required") {
        None => {}
        Some(Value::Array(r)) if r.iter().all(Value::is_string) => {}
        Some(_) => return Err(bad("`required` must be a list of property names")),
    }
    Ok(Value::Object(schema.clone()))
}

/// `tool_choice` and whether several calls may come at once.
fn tool_choice(field: Option<&Value>, tools: &[Tool]) -> Result<(ToolChoice, bool), ApiError> {
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

/// `thinking`: the template's `enable_thinking`, or `None` to leave the
/// template's default. A budget must be below `max_tokens`.
fn thinking(field: Option<&Value>, max_tokens: Option<&Value>) -> Result<Option<bool>, ApiError> {
    let Some(config) = field.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |path: &str, what: &str| invalid("thinking", path, what);
    let kind = config.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad(
            "thinking.type",
            "field required (enabled, adaptive or disabled)",
        )
    })?;
    match kind {
        "enabled" => {
            let budget = config
                .get("budget_tokens")
                .and_then(Value::as_i64)
                .filter(|&b| b >= 1)
                .ok_or_else(|| {
                    bad(
                        "thinking.budget_tokens",
                        "field required (a positive integer)",
                    )
                })?;
            if let Some(max) = max_tokens.and_then(Value::as_i64) {
                if budget >= max {
                    return Err(bad(
                        "thinking.budget_tokens",
                        &format!("{budget} must be less than max_tokens ({max})"),
                    ));
                }
            }
            Ok(Some(true))
        }
        "adaptive" => Ok(Some(true)),
        "disabled" => Ok(Some(false)),
        other => Err(bad(
            "thinking.type",
            &format!("unknown type `{other}` (enabled, adaptive or disabled)"),
        )),
    }
}

/// `output_config.format` as the OpenAI routes' `response_format`.
fn output_format(field: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(config) = field.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |path: &str, what: &str| invalid("output_config", path, what);
    let Some(config) = config.as_object() else {
        return Err(bad("output_config", "must be an object"));
    };
    let Some(format) = config.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        Some(other) => {
            return Err(bad(
                "output_config.format.type",
                &format!("unknown type `{other}` (json_schema)"),
            ))
        }
        None => {
            return Err(bad(
                "output_config.format.type",
                "field required (json_schema)",
            ))
        }
    }
    let Some(schema) = format.get("schema").filter(|s| s.is_object()) else {
        return Err(bad(
            "output_config.format.schema",
            "field required (a JSON schema object)",
        ));
    };
    Ok(Some(json!({"type": "json_schema",
        "json_schema": {"name": "output_config", "schema": schema, "strict": true}})))
}

/// `stop_sequences`: a list of non-empty strings, as `stop`.
fn stop_sequences(field: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let bad = |what: &str| invalid("stop_sequences", "stop_sequences", what);
    match field {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(list)) if list.is_empty() => Ok(None),
        Some(Value::Array(list)) => {
            if list.len() > MAX_STOP_SEQUENCES {
                return Err(bad(&format!(
                    "at most {MAX_STOP_SEQUENCES} on this server, got {}",
                    list.len()
                )));
            }
            if !list
                .iter()
                .all(|s| s.as_str().is_some_and(|s| !s.is_empty()))
            {
                return Err(bad("must hold non-empty strings"));
            }
            Ok(Some(Value::Array(list.clone())))
        }
        Some(_) => Err(bad("must be a list of strings")),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
