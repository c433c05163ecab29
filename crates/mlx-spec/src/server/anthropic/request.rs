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

use super::content::{self, invalid};
use super::tools::{tool_choice, tools};
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
    spec_agent::check_tools(&tools).map_err(|e| {
        let mut e = crate::server::chat_turn::agent_error(&e);
        // The schema is `input_schema` in this API.
        e.message = e.message.replace(").parameters:", ").input_schema:");
        e
    })?;
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
    for (name, value) in [("temperature", &req.temperature), ("top_p", &req.top_p)] {
        match value {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_f64() {
                Some(x) if (0.0..=1.0).contains(&x) => {
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
