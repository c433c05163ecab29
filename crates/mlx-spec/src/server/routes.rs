//! What every handler shares (the server's state, authentication, the
//! body's parse, the request deadline) and the small endpoints: models,
//! health, metrics, the OpenAPI document, 404s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::api::ApiError;
use super::auth::ApiKeys;
use super::chat_prompt::ChatSetup;
use super::generation::timed_out;
use super::metrics::Metrics;
use super::worker::SpecChoice;

/// What every handler shares.
pub struct AppState {
    pub model_id: String,
    /// The fine-tuned adapter applied to every request (`--adapter-path`,
    /// as given).
    pub adapter: Option<String>,
    /// The drafter `--draft-model` loaded (as given), if any.
    pub draft_model: Option<String>,
    pub tokenizer: Arc<spec_text::Tokenizer>,
    /// The tokens XTC never removes (`sampling_args::xtc_special_tokens`).
    pub xtc_special_tokens: Vec<u32>,
    pub vocab_size: usize,
    pub context_length: Option<usize>,
    pub loaded_providers: Vec<String>,
    /// The operator's options of each loaded provider (`--draft-option`):
    /// a request's own options merge over them, never replacing them.
    pub operator_options: BTreeMap<String, spec_core::ProviderOptions>,
    pub default_spec: Option<SpecChoice>,
    /// `None`: no key required.
    pub api_keys: Option<ApiKeys>,
    pub slots: Arc<Semaphore>,
    pub capacity: usize,
    /// Requests in flight or queued per tenant (`--max-concurrency-per-key`).
    pub per_key: super::tenants::PerKeySlots,
    pub engine: Arc<serve_loop::Engine>,
    /// Each loaded provider's default draft length.
    pub default_num_draft: BTreeMap<String, usize>,
    pub metrics: Arc<Metrics>,
    /// What a request gets for the sampling fields and `max_tokens` it
    /// leaves out.
    pub defaults: super::defaults::RequestDefaults,
    /// The longest a request may take, its prompt's preparation included
    /// (`--request-timeout`).
    pub request_timeout: std::time::Duration,
    /// The model's token environment for `response_format`, or why it
    /// has none.
    pub grammar: Result<Arc<crate::grammar::TokenEnv>, String>,
    /// The model's chat template, compiled once, with the tool-call format
    /// and the reasoning markers read from it.
    pub chat: ChatSetup,
    /// The Responses API's stored responses (`--response-store-bytes`).
    pub responses: super::responses::ResponseStore,
}

type Shared = State<Arc<AppState>>;

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh id for an answer: `prefix-` and the time in nanoseconds.
pub fn request_id(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{nanos:x}")
}

/// The request's tenant: `None` when the server requires no key, else the
/// tenant of the key it came with, as a bearer token or `x-api-key` (a
/// 401 without a valid one).
pub fn check_auth(state: &AppState, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    super::auth::tenant_of(state.api_keys.as_ref(), headers)
}

/// The parsed body, or the error for it: 413 for a body over the limit
/// (`--max-body-bytes`), 400 for anything else.
pub fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    parsed.map(|Json(v)| v).map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: "the request body is over this server's limit (--max-body-bytes)"
                    .to_owned(),
                kind: "invalid_request_error",
                param: None,
                code: Some("body_too_large"),
            }
        } else {
            ApiError::invalid(format!("invalid request body: {}", e.body_text()), None)
        }
    })
}

/// Middleware: a request's handling up to its answer's head (its body's
/// upload, its prompt's preparation, a whole non-streamed generation)
/// takes at most `--request-timeout`, else a 504; dropping the handler
/// cancels its engine request.
/// Anthropic's routes answer in Anthropic's error shape.
pub async fn limit_time(State(state): Shared, request: Request, next: Next) -> Response {
    let anthropic = super::anthropic::serves(request.uri().path());
    match tokio::time::timeout(state.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                limit_s = state.request_timeout.as_secs(),
                "a request ran past --request-timeout"
            );
            let e = timed_out(state.request_timeout);
            if anthropic {
                super::anthropic::AnthropicError(e).into_response()
            } else {
                e.into_response()
            }
        }
    }
}

pub async fn models(State(state): Shared, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [model_json(&state.model_id)]})).into_response()
}

/// `GET /v1/models/{model}` (OpenAI's retrieve; a repo id's slash
/// included): the served model, or a 404 `model_not_found`.
pub async fn model(
    State(state): Shared,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    if let Err(e) = super::admission::check_model(&state, Some(&id)) {
        return e.into_response();
    }
    Json(model_json(&state.model_id)).into_response()
}

fn model_json(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "mlx-spec"})
}

/// `{"status": "ok"}`, or a 503 once the engine thread has panicked (the
/// server then stops; a supervisor restarts it).
pub async fn health(State(state): Shared) -> Response {
    health_of(state.engine.failure().is_some())
}

fn health_of(engine_failed: bool) -> Response {
    if engine_failed {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unhealthy", "reason": "the engine thread panicked"})),
        )
            .into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

pub async fn metrics(State(state): Shared) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state
            .metrics
            .render(&state.engine.stats(), state.engine.held()),
    )
        .into_response()
}

pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
        .into_response()
}

pub async fn not_found(uri: axum::http::Uri) -> Response {
    let e = ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint".into(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    };
    if super::anthropic::serves(uri.path()) {
        super::anthropic::AnthropicError(e).into_response()
    } else {
        e.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_turns_unhealthy_once_the_engine_panicked() {
        assert_eq!(health_of(false).status(), StatusCode::OK);
        assert_eq!(health_of(true).status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
