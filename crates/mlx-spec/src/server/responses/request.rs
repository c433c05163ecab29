//! A Responses request, checked field by field before anything reaches the
//! engine, and translated into the chat pipeline's turn pieces and the
//! generation fields the other routes use ([`Common`]): `instructions`
//! into a leading system message, `tools` (flat function tools) and
//! `tool_choice` into the agent's tools, `text.format` into a
//! `response_format`, `reasoning.effort` into the template's
//! `enable_thinking` / `reasoning_effort`, `max_output_tokens` into
//! `max_tokens`, `include` + `top_logprobs` into log-probabilities. Our
//! extensions (`speculative`, `cache_salt`, `seed`, `top_k`, `min_p`,
//! `logit_bias`, `stop`, mlx_lm.server's penalties and XTC fields) pass
//! through as on the OpenAI routes. The fields
//! a response echoes come back as [`Echo`].

use serde::Deserialize;
use serde_json::{json, Map, Value};
use spec_agent::{Tool, ToolChoice};

use crate::server::api::{ApiError, Common};
use crate::server::openai::{tool_choice_of, tools_of, ToolShape};

/// The fields this server reads; `service_tier`, `prompt_cache_key`,
/// `safety_identifier` and `stream_options` are accepted and ignored.
#[derive(Debug, Deserialize, Default)]
pub struct ResponsesRequest {
    pub model: Option<Value>,
    pub input: Option<Value>,
    pub instructions: Option<Value>,
    pub previous_response_id: Option<Value>,
    pub store: Option<Value>,
    pub stream: Option<Value>,
    pub max_output_tokens: Option<Value>,
    pub temperature: Option<Value>,
    pub top_p: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub include: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub metadata: Option<Value>,
    pub user: Option<Value>,
    pub truncation: Option<Value>,
    pub background: Option<Value>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
    pub max_tool_calls: Option<Value>,
    /// Our extensions, as on the OpenAI routes.
    pub speculative: Option<Value>,
    pub cache_salt: Option<Value>,
    pub seed: Option<Value>,
    pub top_k: Option<Value>,
    pub min_p: Option<Value>,
    pub logit_bias: Option<Value>,
    pub stop: Option<Value>,
    pub repetition_penalty: Option<Value>,
    pub repetition_context_size: Option<Value>,
    pub presence_penalty: Option<Value>,
    pub presence_context_size: Option<Value>,
    pub frequency_penalty: Option<Value>,
    pub frequency_context_size: Option<Value>,
    pub xtc_probability: Option<Value>,
    pub xtc_threshold: Option<Value>,
}

/// What a response repeats of its request (OpenAI's response object
/// carries the settings it ran with).
pub type Echo = Map<String, Value>;

/// The request, checked: everything but the messages, which need the
/// stored conversation of `previous_response_id` ([`super::input`]).
#[derive(Debug)]
pub struct Checked {
    pub common: Common,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub template_kwargs: Map<String, Value>,
    pub logprobs: Option<usize>,
    /// `truncation: "auto"`: the oldest turns dropped to fit the context.
    pub truncate: bool,
    pub echo: Echo,
}

fn invalid(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(message, Some(param))
}

/// The include values this server knows: log-probabilities, and the ones
/// that ask for the output of hosted tools or encrypted reasoning, which
/// never occur here (reasoning comes back as plain text).
const INCLUDES: [&str; 7] = [
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "message.input_image.image_url",
];

/// The most log-probability alternatives a token may list.
const MAX_TOP_LOGPROBS: i64 = 20;

/// Checks `req` and translates what it can without the store.
pub fn check(req: &ResponsesRequest) -> Result<Checked, ApiError> {
    for (name, value) in [
        ("background", &req.background),
        ("conversation", &req.conversation),
        ("prompt", &req.prompt),
        ("max_tool_calls", &req.max_tool_calls),
    ] {
        let unsupported = match value {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => true,
        };
        if unsupported {
            return Err(ApiError::invalid(
                format!("`{name}` is not supported by this server"),
                Some(name),
            ));
        }
    }
    let mut common = Map::new();
    let mut echo = Echo::new();
    match &req.model {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) => {
            common.insert("model".into(), json!(m));
        }
        Some(_) => return Err(invalid("model", "`model` must be a string")),
    }
    let max_output_tokens = match &req.max_output_tokens {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Some(n),
            _ => {
                return Err(invalid(
                    "max_output_tokens",
                    "`max_output_tokens` must be an integer of at least 1",
                ))
            }
        },
    };
    if let Some(n) = max_output_tokens {
        common.insert("max_tokens".into(), json!(n));
    }
    echo.insert("max_output_tokens".into(), json!(max_output_tokens));
    let instructions = optional_string(&req.instructions, "instructions")?;
    echo.insert("instructions".into(), json!(instructions));
    let previous_response_id = optional_string(&req.previous_response_id, "previous_response_id")?;
    echo.insert("previous_response_id".into(), json!(previous_response_id));
    let store = optional_bool(&req.store, "store")?.unwrap_or(true);
    echo.insert("store".into(), json!(store));
    if let Some(stream) = optional_bool(&req.stream, "stream")? {
        common.insert("stream".into(), json!(stream));
    }
    for (name, value, range) in [
        ("temperature", &req.temperature, 0.0..=2.0),
        ("top_p", &req.top_p, 0.0..=1.0),
    ] {
        let x = match value {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_f64() {
                Some(x) if range.contains(&x) => Some(x),
                _ => {
                    return Err(invalid(
                        name,
                        format!(
                            "`{name}` must be a number from {} to {}",
                            range.start(),
                            range.end()
                        ),
                    ))
                }
            },
        };
        if let Some(x) = x {
            common.insert(name.into(), json!(x));
        }
        echo.insert(name.into(), json!(x));
    }
    let logprobs = logprobs(&req.include, &req.top_logprobs, &mut echo)?;
    let tools = tools_of(req.tools.as_ref(), ToolShape::Responses)?;
    let tool_choice = tool_choice_of(req.tool_choice.as_ref(), &tools, ToolShape::Responses)?;
    echo.insert(
        "tools".into(),
        Value::Array(tools.iter().map(tool_json).collect()),
    );
    echo.insert(
        "tool_choice".into(),
        match &tool_choice {
            ToolChoice::Named(name) => json!({"type": "function", "name": name}),
            other => json!(other.as_str()),
        },
    );
    let parallel_tool_calls =
        optional_bool(&req.parallel_tool_calls, "parallel_tool_calls")?.unwrap_or(true);
    echo.insert("parallel_tool_calls".into(), json!(parallel_tool_calls));
    let format = text_format(req.text.as_ref())?;
    echo.insert(
        "text".into(),
        json!({"format": format.clone().unwrap_or_else(|| json!({"type": "text"}))}),
    );
    if let Some(format) = format {
        common.insert("response_format".into(), response_format(format));
    }
    let mut template_kwargs = Map::new();
    echo.insert(
        "reasoning".into(),
        reasoning(req.reasoning.as_ref(), &mut template_kwargs)?,
    );
    echo.insert("metadata".into(), metadata(&req.metadata)?);
    echo.insert("user".into(), json!(optional_string(&req.user, "user")?));
    let truncation = match &req.truncation {
        None | Some(Value::Null) => "disabled",
        Some(Value::String(t)) if t == "disabled" || t == "auto" => t.as_str(),
        Some(_) => {
            return Err(invalid(
                "truncation",
                "`truncation` must be \"disabled\" or \"auto\"",
            ))
        }
    };
    echo.insert("truncation".into(), json!(truncation));
    let truncate = truncation == "auto";
    for (name, value) in [
        ("speculative", &req.speculative),
        ("cache_salt", &req.cache_salt),
        ("seed", &req.seed),
        ("top_k", &req.top_k),
        ("min_p", &req.min_p),
        ("logit_bias", &req.logit_bias),
        ("stop", &req.stop),
        ("repetition_penalty", &req.repetition_penalty),
        ("repetition_context_size", &req.repetition_context_size),
        ("presence_penalty", &req.presence_penalty),
        ("presence_context_size", &req.presence_context_size),
        ("frequency_penalty", &req.frequency_penalty),
        ("frequency_context_size", &req.frequency_context_size),
        ("xtc_probability", &req.xtc_probability),
        ("xtc_threshold", &req.xtc_threshold),
    ] {
        if let Some(v) = value.as_ref().filter(|v| !v.is_null()) {
            common.insert(name.into(), v.clone());
        }
    }
    // The standard fields were checked above; a type error here is one of
    // the extensions'.
    let common: Common = serde_json::from_value(Value::Object(common))
        .map_err(|e| ApiError::invalid(format!("an extension field is invalid: {e}"), None))?;
    Ok(Checked {
        common,
        instructions,
        previous_response_id,
        store,
        tools,
        tool_choice,
        parallel_tool_calls,
        template_kwargs,
        logprobs,
        truncate,
        echo,
    })
}

fn optional_string(value: &Option<Value>, name: &'static str) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(name, format!("`{name}` must be a string"))),
    }
}

fn optional_bool(value: &Option<Value>, name: &'static str) -> Result<Option<bool>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(invalid(name, format!("`{name}` must be a boolean"))),
    }
}

/// `include` and `top_logprobs`: `Some(n)` when the answer's text carries
/// log-probabilities with `n` alternatives each.
fn logprobs(
    include: &Option<Value>,
    top: &Option<Value>,
    echo: &mut Echo,
) -> Result<Option<usize>, ApiError> {
    let mut wanted = false;
    match include {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for item in list {
                match item.as_str() {
                    Some("message.output_text.logprobs") => wanted = true,
                    Some(known) if INCLUDES.contains(&known) => {}
                    _ => {
                        return Err(invalid(
                            "include",
                            format!(
                                "`include` holds {item}, which this server does not know ({})",
                                INCLUDES.join(", ")
                            ),
                        ))
                    }
                }
            }
        }
        Some(_) => return Err(invalid("include", "`include` must be a list of strings")),
    }
    let top = match top {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => Some(n as usize),
            _ => {
                return Err(invalid(
                    "top_logprobs",
                    format!("`top_logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
                ))
            }
        },
    };
    echo.insert("top_logprobs".into(), json!(top));
    Ok((wanted || top.is_some()).then(|| top.unwrap_or(0)))
}

/// A tool as the response lists it.
fn tool_json(tool: &Tool) -> Value {
    json!({"type": "function", "name": tool.name, "description": tool.description,
        "parameters": tool.parameters, "strict": true})
}

/// `text.format`, checked for its shape (the schema itself is checked
/// where every route's `response_format` is): `None` for plain text.
fn text_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(text) = text.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(text) = text.as_object() else {
        return Err(invalid("text", "`text` must be an object"));
    };
    let Some(format) = text.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object" | "json_schema" | "regex" | "grammar") => Ok(Some(format.clone())),
        Some(other) => Err(invalid(
            "text",
            format!("`text.format.type`: unknown type `{other}` (text, json_object, json_schema; ours: regex, grammar)"),
        )),
        None => Err(invalid(
            "text",
            "`text.format.type` is required (text, json_object or json_schema)",
        )),
    }
}

/// `text.format` in the shape of the OpenAI routes' `response_format`
/// (whose checks name `response_format`): a `json_schema`'s fields move
/// under `json_schema`.
fn response_format(format: Value) -> Value {
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return format;
    }
    let mut inner = format.as_object().cloned().unwrap_or_default();
    inner.remove("type");
    json!({"type": "json_schema", "json_schema": inner})
}

/// `reasoning`: its `effort` into the template (`none` turns thinking
/// off, any other effort on and passes as `reasoning_effort`); the object
/// the response echoes.
fn reasoning(field: Option<&Value>, kwargs: &mut Map<String, Value>) -> Result<Value, ApiError> {
    let Some(config) = field.filter(|v| !v.is_null()) else {
        return Ok(json!({"effort": null, "summary": null}));
    };
    let Some(config) = config.as_object() else {
        return Err(invalid("reasoning", "`reasoning` must be an object"));
    };
    let effort = match config.get("effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e))
            if ["none", "minimal", "low", "medium", "high", "xhigh"].contains(&e.as_str()) =>
        {
            Some(e.clone())
        }
        Some(other) => {
            let message = format!(
                "`reasoning.effort` must be none, minimal, low, medium, high or xhigh, got {other}"
            );
            return Err(invalid("reasoning", message));
        }
    };
    match effort.as_deref() {
        None => {}
        Some("none") => {
            kwargs.insert("enable_thinking".into(), json!(false));
        }
        Some(e) => {
            kwargs.insert("enable_thinking".into(), json!(true));
            kwargs.insert("reasoning_effort".into(), json!(e));
        }
    }
    let summary = match config.get("summary") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) if ["auto", "concise", "detailed"].contains(&s.as_str()) => {
            json!(s)
        }
        Some(_) => {
            return Err(invalid(
                "reasoning",
                "`reasoning.summary` must be auto, concise or detailed",
            ))
        }
    };
    Ok(json!({"effort": effort, "summary": summary}))
}

/// `metadata`: at most 16 string values (OpenAI's limits: keys up to 64
/// characters, values up to 512).
fn metadata(field: &Option<Value>) -> Result<Value, ApiError> {
    match field {
        None | Some(Value::Null) => Ok(json!({})),
        Some(Value::Object(m))
            if m.len() <= 16
                && m.iter().all(|(k, v)| {
                    k.chars().count() <= 64 && v.as_str().is_some_and(|v| v.chars().count() <= 512)
                }) =>
        {
            Ok(Value::Object(m.clone()))
        }
        Some(_) => Err(invalid(
            "metadata",
            "`metadata` must be an object of at most 16 string values (keys up to 64 characters, values up to 512)",
        )),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
