//! HTTP handlers: authentication, validation, queueing (429 past the bound),
//! and the OpenAI response shapes, streaming (SSE) or not.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::BTreeMap;

use serve_loop::ServeError;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::api::{
    ApiError, ChatRequest, Common, CompletionRequest, Params, Prompt, SpecField, SpecRequest,
};
use super::auth::ApiKeys;
use super::logprobs::{self, CharOffset, TokenLogprob};
use super::metrics::Metrics;
use super::response_format;
use super::tenants::KeySlot;
use super::worker::{CancelOnDrop, Done, Event, SpecChoice, Submission};

/// What every handler shares.
pub struct AppState {
    pub model_id: String,
    pub tokenizer: Arc<spec_text::Tokenizer>,
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
    pub default_max_tokens: usize,
    /// The longest a request may take, its prompt's preparation included
    /// (`--request-timeout`).
    pub request_timeout: std::time::Duration,
    /// The model's token environment for `response_format`, or why it
    /// has none.
    pub grammar: Result<Arc<crate::grammar::TokenEnv>, String>,
}

type Shared = State<Arc<AppState>>;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn request_id(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{nanos:x}")
}

/// The request's tenant: `None` when the server requires no key, else the
/// tenant of the key it came with, as a bearer token or `x-api-key` (a
/// 401 without a valid one).
fn check_auth(state: &AppState, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    super::auth::tenant_of(state.api_keys.as_ref(), headers)
}

/// The parsed body, or the error for it: 413 for a body over the limit
/// (`--max-body-bytes`), 400 for anything else.
fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
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

fn speculation(
    state: &AppState,
    field: &Option<SpecField>,
) -> Result<Option<SpecChoice>, ApiError> {
    match field {
        None => Ok(state.default_spec.clone()),
        Some(SpecField::Off(false)) => Ok(None),
        Some(SpecField::Off(true)) => Ok(state.default_spec.clone()),
        Some(SpecField::On(s)) => {
            spec_choice(s, &state.loaded_providers, &state.operator_options).map(Some)
        }
    }
}

/// The speculation a `speculative` object asks for, checked against the
/// providers the server loaded. Its provider options must be ones the
/// provider lets a request set (`ProviderRegistration::request_options`),
/// in range: anything else (a path, a model directory, a size of shared
/// state) is the operator's and a 400 naming the option. Valid options
/// merge over the operator's for that provider.
fn spec_choice(
    s: &SpecRequest,
    loaded_providers: &[String],
    operator_options: &BTreeMap<String, spec_core::ProviderOptions>,
) -> Result<SpecChoice, ApiError> {
    if !loaded_providers.contains(&s.provider) {
        return Err(ApiError::invalid(
            format!(
                "unknown or unloaded draft provider `{}` (loaded: {})",
                s.provider,
                loaded_providers.join(", ")
            ),
            Some("speculative"),
        ));
    }
    let num_draft = match s.num_draft_tokens {
        None => None,
        Some(n) if (1..=16).contains(&n) => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(
                format!("`num_draft_tokens` must be between 1 and 16, got {n}"),
                Some("speculative"),
            ))
        }
    };
    let mut options = spec_core::ProviderOptions::new();
    for (k, v) in &s.options {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                return Err(ApiError::invalid(
                    format!("provider option `{k}` must be a string, number or boolean"),
                    Some("speculative"),
                ))
            }
        };
        options.insert(k.clone(), v);
    }
    if !options.is_empty() {
        let allowed = spec_core::resolve(&s.provider)
            .map(|r| r.request_options)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("speculative")))?;
        spec_core::check_request_options(&s.provider, allowed, &options)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("speculative")))?;
        let operator = operator_options
            .get(&s.provider)
            .cloned()
            .unwrap_or_default();
        options = spec_core::merge_request_options(&operator, &options);
    }
    let policy = match s.draft_policy.as_deref() {
        None => serve_loop::DraftPolicy::default(),
        Some(name) => serve_loop::DraftPolicy::parse(name).ok_or_else(|| {
            ApiError::invalid(
                format!("`draft_policy` must be \"goodput\" or \"per-row\", got \"{name}\""),
                Some("speculative"),
            )
        })?,
    };
    Ok(SpecChoice {
        provider: s.provider.clone(),
        num_draft,
        adaptive: s.adaptive.unwrap_or(true),
        policy,
        options,
    })
}

/// A request past validation and admission: it holds its places in
/// `--max-concurrency` and its key's limit while its prompt is prepared
/// and while it runs.
struct Admitted {
    params: Params,
    spec: Option<SpecChoice>,
    tenant: Option<String>,
    permit: (OwnedSemaphorePermit, Option<KeySlot>),
}

/// Validates what needs no prompt and takes the request's places (429
/// when the server or the key is full).
fn admit(
    state: &AppState,
    tenant: Option<String>,
    common: &Common,
    logprobs: Option<usize>,
) -> Result<Admitted, ApiError> {
    let mut params = common.params(state.vocab_size, state.default_max_tokens)?;
    params.logprobs = logprobs;
    if let Some(model) = &common.model {
        if model != &state.model_id && !model.is_empty() {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "model `{model}` does not exist (this server serves `{}`)",
                    state.model_id
                ),
                kind: "invalid_request_error",
                param: Some("model"),
                code: Some("model_not_found"),
            });
        }
    }
    let spec = speculation(state, &params.speculative)?;
    // The key's own place first: a key at its limit is refused without
    // taking a place another key could use.
    let key_slot = match &tenant {
        Some(t) => Some(state.per_key.try_take(t).ok_or_else(|| {
            state.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
            ApiError::key_busy(state.per_key.limit())
        })?),
        None => None,
    };
    let permit = state.slots.clone().try_acquire_owned().map_err(|_| {
        state.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
        ApiError::busy(state.capacity)
    })?;
    Ok(Admitted {
        params,
        spec,
        tenant,
        permit: (permit, key_slot),
    })
}

/// Checks the prepared prompt and submits the admitted request to the
/// engine; returns the event stream and the guard that cancels the
/// request when the handler goes away.
fn submit(
    state: &AppState,
    admitted: Admitted,
    prompt: Vec<u32>,
    constraint: Option<Box<dyn spec_core::Constraint>>,
) -> Result<(Params, mpsc::UnboundedReceiver<Event>, CancelOnDrop), ApiError> {
    let Admitted {
        params,
        spec,
        tenant,
        permit,
    } = admitted;
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
    }
    if let Some(ctx) = state.context_length {
        if prompt.len() + params.max_tokens > ctx {
            return Err(ApiError::invalid(
                format!("prompt ({} tokens) + max_tokens ({}) exceeds the model's context of {ctx} tokens", prompt.len(), params.max_tokens),
                Some("max_tokens"),
            ));
        }
    }
    let default_num_draft = spec
        .as_ref()
        .and_then(|s| state.default_num_draft.get(&s.provider).copied())
        .unwrap_or(0);
    let mut processors: Vec<Box<dyn spec_core::LogitsProcessor + Send>> = Vec::new();
    if !params.logit_bias.is_empty() {
        let bias = spec_core::LogitBias::new(&params.logit_bias, state.vocab_size)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("logit_bias")))?;
        processors.push(Box::new(bias));
    }
    let job = Submission {
        prompt,
        params: params.clone(),
        spec,
        default_num_draft,
        tenant,
        cache_salt: params.cache_salt.clone(),
        processors,
        constraint,
        permit,
    };
    let (rx, cancel) = super::worker::submit(&state.engine, &state.tokenizer, &state.metrics, job)
        .map_err(|e| match e {
            ServeError::Busy { .. } => {
                state.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
                ApiError::busy(state.capacity)
            }
            ServeError::TooLong { .. } => ApiError::invalid(e.to_string(), Some("max_tokens")),
            e => {
                tracing::error!(error = %spec_core::error::report(&e), "a request could not be submitted");
                ApiError::internal(super::worker::public_message(&e))
            }
        })?;
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    Ok((params, rx, cancel))
}

/// The answer to a request that ran past `--request-timeout`.
fn timed_out(limit: std::time::Duration) -> ApiError {
    ApiError {
        status: StatusCode::GATEWAY_TIMEOUT,
        message: format!(
            "the request ran past this server's limit of {} s (--request-timeout)",
            limit.as_secs()
        ),
        kind: "server_error",
        param: None,
        code: Some("request_timeout"),
    }
}

/// Middleware: a request's handling up to its answer's head (its body's
/// upload, its prompt's preparation, a whole non-streamed generation)
/// takes at most `--request-timeout`, else a 504; dropping the handler
/// cancels its engine request.
pub async fn limit_time(State(state): Shared, request: Request, next: Next) -> Response {
    match tokio::time::timeout(state.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                limit_s = state.request_timeout.as_secs(),
                "a request ran past --request-timeout"
            );
            timed_out(state.request_timeout).into_response()
        }
    }
}

/// Turns a request's text into prompt tokens (a chat template's render,
/// the tokenizer); run on a blocking thread, after admission.
type Prepare = Box<dyn FnOnce(&AppState) -> Result<Vec<u32>, ApiError> + Send>;

fn spec_json(done: &Done) -> Value {
    match &done.provider {
        None => Value::Null,
        Some(p) => json!({
            "provider": p,
            "drafted": done.stats.drafted,
            "accepted": done.stats.accepted,
            "acceptance_rate": done.stats.acceptance_rate(),
            "mean_accepted_length": done.stats.mean_accepted_length(),
            "tokens_per_target_forward": done.stats.tokens_per_forward(),
            "target_calls": done.stats.target_calls,
        }),
    }
}

fn usage(done: &Done) -> Value {
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

/// The 400 of a request the engine refused for its own input (its
/// provider options): the whole chain, which names only what the request
/// sent.
fn refused_input(e: &ServeError) -> ApiError {
    ApiError::invalid(spec_core::error::report(e), Some("speculative"))
}

/// A whole answer: its text, its tokens' log-probabilities (when asked
/// for) and its end.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<(String, Vec<TokenLogprob>, Done), ApiError> {
    let mut text = String::new();
    let mut lps = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t, l) => {
                text.push_str(&t);
                lps.extend(l);
            }
            Event::Done(done) => return Ok((text, lps, done)),
            Event::Error(e) => return Err(ApiError::internal(e)),
            Event::Invalid(e) => return Err(refused_input(&e)),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before finishing the request",
    ))
}

/// Admits the request, prepares its prompt off the async workers, runs
/// it, and answers (SSE when asked). [`limit_time`] bounds it up to the
/// answer's head; a stream's relay stops at the same deadline.
async fn respond(
    state: Arc<AppState>,
    tenant: Option<String>,
    kind: Kind,
    prepare: Prepare,
    common: Common,
    logprobs: Option<usize>,
) -> Response {
    let deadline = tokio::time::Instant::now() + state.request_timeout;
    let refused = |e: ApiError| {
        if e.status == StatusCode::BAD_REQUEST || e.status == StatusCode::NOT_FOUND {
            state.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
        }
        e.into_response()
    };
    let admitted = match admit(&state, tenant, &common, logprobs) {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    // The prompt's render and the constraint's compilation, off the async
    // workers: a bad schema or grammar is a 400 before the request joins.
    let preparing = {
        let state = state.clone();
        let format = admitted.params.response_format.clone();
        tokio::task::spawn_blocking(move || {
            let prompt = prepare(&state)?;
            let env = state.grammar.as_deref().map_err(String::as_str);
            let constraint = response_format::constraint_of(env, &format)?;
            Ok::<_, ApiError>((prompt, constraint))
        })
    };
    // Past the deadline `limit_time` drops this future; the render runs
    // on, its fuel bounding it.
    let (prompt, constraint) = match preparing.await {
        Ok(Ok(prepared)) => prepared,
        Ok(Err(e)) => return refused(e),
        Err(e) => {
            tracing::error!(error = %e, "preparing a prompt panicked");
            return ApiError::internal("preparing the prompt failed").into_response();
        }
    };
    let (params, rx, cancel) = match submit(&state, admitted, prompt, constraint) {
        Ok(v) => v,
        Err(e) => return refused(e),
    };
    state.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
    let _guard = InFlight(state.clone());
    let (id, object, chunk_object) = match kind {
        Kind::Chat => (
            request_id("chatcmpl"),
            "chat.completion",
            "chat.completion.chunk",
        ),
        Kind::Completion => (request_id("cmpl"), "text_completion", "text_completion"),
    };
    let created = now();
    let model = state.model_id.clone();
    if !params.stream {
        // Dropped with this future: a client that goes away cancels.
        // Dropped with this future (a client gone, `limit_time`'s
        // deadline): the request is cancelled.
        let _cancel = cancel;
        return match collect(rx).await {
            Ok((text, lps, done)) => {
                let lps = match (params.logprobs, kind) {
                    (None, _) => Value::Null,
                    (Some(_), Kind::Chat) => logprobs::chat_json(&state.tokenizer, &lps),
                    (Some(_), Kind::Completion) => logprobs::completion_json(
                        &state.tokenizer,
                        &lps,
                        &mut CharOffset::default(),
                    ),
                };
                let choice = match kind {
                    Kind::Chat => {
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": done.finish_reason, "logprobs": lps})
                    }
                    Kind::Completion => {
                        json!({"index": 0, "text": text, "finish_reason": done.finish_reason, "logprobs": lps})
                    }
                };
                Json(json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice], "usage": usage(&done), "speculative": spec_json(&done)})).into_response()
            }
            Err(e) => e.into_response(),
        };
    }
    let include_usage = params.include_usage;
    let chunk = move |delta: Value, finish: Option<&str>, lps: Value| -> Value {
        let choice = match kind {
            Kind::Chat => {
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps})
            }
            Kind::Completion => {
                json!({"index": 0, "text": delta.get("content").cloned().unwrap_or(Value::String(String::new())), "finish_reason": finish, "logprobs": lps})
            }
        };
        json!({"id": id, "object": chunk_object, "created": created, "model": model, "choices": [choice]})
    };
    // A relay task turns engine events into chunks; when the client goes
    // away the SSE stream drops its receiver, the relay sees its channel
    // closed and ends, and its guard cancels the request: the engine frees
    // the row within one step.
    let (out_tx, out_rx) = mpsc::channel::<String>(64);
    let mut rx = rx;
    let limit = state.request_timeout;
    let tokenizer = Arc::clone(&state.tokenizer);
    let wants_logprobs = params.logprobs.is_some();
    tokio::spawn(async move {
        // Where the next token's text starts (completions' `text_offset`).
        let mut offset = CharOffset::default();
        let _guard = _guard;
        let _cancel = cancel;
        if kind == Kind::Chat
            && out_tx
                .send(
                    chunk(
                        json!({"role": "assistant", "content": ""}),
                        None,
                        Value::Null,
                    )
                    .to_string(),
                )
                .await
                .is_err()
        {
            return;
        }
        loop {
            let event = tokio::select! {
                event = rx.recv() => event,
                () = out_tx.closed() => return,
                () = tokio::time::sleep_until(deadline) => {
                    // Dropping the guard cancels the request.
                    let _ = out_tx.send(timed_out(limit).body().to_string()).await;
                    return;
                }
            };
            let Some(event) = event else { break };
            let out: Vec<Value> = match event {
                Event::Text(t, l) => {
                    let lps = match kind {
                        _ if !wants_logprobs => Value::Null,
                        Kind::Chat => logprobs::chat_json(&tokenizer, &l),
                        Kind::Completion => logprobs::completion_json(&tokenizer, &l, &mut offset),
                    };
                    vec![chunk(json!({"content": t}), None, lps)]
                }
                Event::Done(done) => {
                    let mut last = chunk(json!({}), Some(done.finish_reason), Value::Null);
                    last["speculative"] = spec_json(&done);
                    let mut v = vec![last];
                    if include_usage {
                        let mut u = chunk(json!({}), None, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage(&done);
                        v.push(u);
                    }
                    v
                }
                Event::Error(e) => vec![ApiError::internal(e).body()],
                Event::Invalid(e) => vec![refused_input(&e).body()],
            };
            for v in out {
                if out_tx.send(v.to_string()).await.is_err() {
                    return;
                }
            }
        }
        let _ = out_tx.send("[DONE]".to_owned()).await;
    });
    let stream =
        ReceiverStream::new(out_rx).map(|data| Ok::<_, Infallible>(SseEvent::default().data(data)));
    Sse::new(stream).into_response()
}

/// Decrements the in-flight gauge when the response (or stream) is dropped.
struct InFlight(Arc<AppState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub async fn chat(
    State(state): Shared,
    headers: HeaderMap,
    parsed: Result<Json<ChatRequest>, JsonRejection>,
) -> Response {
    let tenant = match check_auth(&state, &headers) {
        Ok(tenant) => tenant,
        Err(e) => return e.into_response(),
    };
    let req = match body(parsed) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let messages = match req.messages() {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let logprobs = match logprobs::chat_request(req.logprobs.as_ref(), req.top_logprobs.as_ref()) {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    let prepare: Prepare = Box::new(move |state: &AppState| {
        let template = state.tokenizer.chat_template().map_err(|e| {
            ApiError::invalid(format!("this model has no usable chat template: {e}"), None)
        })?;
        let text = template.render(&messages, true).map_err(|e| {
            ApiError::invalid(
                format!("the chat template rejected the messages: {e}"),
                Some("messages"),
            )
        })?;
        state
            .tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))
    });
    respond(
        state.clone(),
        tenant,
        Kind::Chat,
        prepare,
        req.common,
        logprobs,
    )
    .await
}

pub async fn completions(
    State(state): Shared,
    headers: HeaderMap,
    parsed: Result<Json<CompletionRequest>, JsonRejection>,
) -> Response {
    let tenant = match check_auth(&state, &headers) {
        Ok(tenant) => tenant,
        Err(e) => return e.into_response(),
    };
    let req = match body(parsed) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let logprobs = match logprobs::completion_request(req.logprobs.as_ref()) {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    let text = match &req.prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Texts(v) if v.len() == 1 => v[0].clone(),
        Prompt::Texts(_) => {
            return ApiError::invalid(
                "batched prompts are not supported: send one prompt",
                Some("prompt"),
            )
            .into_response()
        }
    };
    let prepare: Prepare = Box::new(move |state: &AppState| {
        state
            .tokenizer
            .encode(&text, true)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))
    });
    respond(
        state.clone(),
        tenant,
        Kind::Completion,
        prepare,
        req.common,
        logprobs,
    )
    .await
}

pub async fn models(State(state): Shared, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [{"id": state.model_id, "object": "model", "created": 0, "owned_by": "mlx-spec"}]})).into_response()
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

pub async fn not_found() -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint".into(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_turns_unhealthy_once_the_engine_panicked() {
        assert_eq!(health_of(false).status(), StatusCode::OK);
        assert_eq!(health_of(true).status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    fn choice(body: Value) -> Result<SpecChoice, ApiError> {
        let request: SpecRequest = serde_json::from_value(body).expect("a speculative object");
        let loaded = ["prompt-lookup", "suffix", "draft-model"].map(str::to_owned);
        let operator = BTreeMap::from([
            (
                "draft-model".to_owned(),
                spec_core::ProviderOptions::from([("model", "/models/drafter")]),
            ),
            (
                "suffix".to_owned(),
                spec_core::ProviderOptions::from([
                    ("global_per_tenant", "true"),
                    ("max_depth", "32"),
                ]),
            ),
        ]);
        spec_choice(&request, &loaded, &operator)
    }

    /// Found on a live server: `"model": "/etc"` for `draft-model` made the
    /// engine thread try to load `/etc` and answer 500. Paths, model
    /// directories and sizes of shared state are the operator's: a request
    /// naming one is a 400 naming the option, before anything is built.
    #[test]
    fn requests_never_name_files_or_size_shared_state() {
        for (body, fragment) in [
            (
                json!({"provider": "draft-model", "model": "/etc"}),
                "option `model` cannot be set by a request",
            ),
            (
                json!({"provider": "draft-model", "dtype": "keep"}),
                "option `dtype` cannot be set by a request",
            ),
            (
                json!({"provider": "suffix", "global_per_tenant": false}),
                "option `global_per_tenant` cannot be set by a request",
            ),
            (
                json!({"provider": "suffix", "max_tree_tokens": 100000000}),
                "option `max_tree_tokens`",
            ),
            (
                json!({"provider": "prompt-lookup", "max_ngram": 1000}),
                "a whole number from 1 to 32",
            ),
            (
                json!({"provider": "prompt-lookup", "bogus": 1}),
                "option `bogus` cannot be set by a request",
            ),
            (
                json!({"provider": "suffix", "min_token_prob": 2.5}),
                "a number from 0 to 1",
            ),
        ] {
            let err = choice(body.clone()).expect_err("must be refused");
            assert_eq!(
                (err.status, err.param),
                (StatusCode::BAD_REQUEST, Some("speculative")),
                "{body}"
            );
            assert!(err.message.contains(fragment), "{body}: {}", err.message);
        }
    }

    #[test]
    fn request_options_merge_over_the_operators() {
        let merged = choice(json!({"provider": "suffix", "min_token_prob": 0.2})).expect("valid");
        assert_eq!(
            merged.options,
            spec_core::ProviderOptions::from([
                ("global_per_tenant", "true"),
                ("max_depth", "32"),
                ("min_token_prob", "0.2"),
            ]),
            "the operator's options stay"
        );
        // No options of its own: the loaded provider, as the operator built it.
        let plain = choice(json!({"provider": "draft-model"})).expect("valid");
        assert!(plain.options.is_empty());
    }

    #[test]
    fn adaptive_false_asks_for_a_fixed_draft_length() {
        let fixed = choice(json!({"provider": "prompt-lookup", "num_draft_tokens": 4,
            "adaptive": false, "max_ngram": 3}))
        .expect("valid");
        assert_eq!((fixed.num_draft, fixed.adaptive), (Some(4), false));
        assert_eq!(
            fixed.options,
            spec_core::ProviderOptions::from([("max_ngram", "3")]),
            "`adaptive` is the server's, not a provider option"
        );
        let default = choice(json!({"provider": "prompt-lookup"})).expect("valid");
        assert!(default.adaptive, "the controller is on unless turned off");
        assert!(
            choice(json!({"provider": "prompt-lookup", "adaptive": true}))
                .expect("valid")
                .adaptive
        );
        assert_eq!(default.policy, serve_loop::DraftPolicy::Goodput);
        let per_row =
            choice(json!({"provider": "prompt-lookup", "draft_policy": "per-row"})).expect("valid");
        assert_eq!(per_row.policy, serve_loop::DraftPolicy::PerRow);
        assert!(
            per_row.options.is_empty(),
            "`draft_policy` is no provider option"
        );
        assert!(choice(json!({"provider": "prompt-lookup", "draft_policy": "fast"})).is_err());
    }

    #[test]
    fn bad_speculative_objects_are_refused() {
        for body in [
            json!({"provider": "gemma4-assistant"}),
            json!({"provider": "prompt-lookup", "num_draft_tokens": 17}),
            json!({"provider": "prompt-lookup", "max_ngram": [3]}),
        ] {
            let err = choice(body.clone()).expect_err("must fail");
            assert_eq!(
                (err.status, err.param),
                (StatusCode::BAD_REQUEST, Some("speculative")),
                "{body}"
            );
        }
    }
}
