//! OpenAI's Responses API on the same engine as the other routes:
//! `POST /v1/responses` (streamed as its named events or not),
//! `POST /v1/responses/input_tokens`, `GET /v1/responses/{id}` (and its
//! `input_items`) and `DELETE /v1/responses/{id}`. A request
//! translates into the chat pipeline's turn ([`request`], [`input`]), so
//! batching, the prefix cache, grammars and per-request `speculative` are
//! the other routes'; its answer is output items built from the turn's
//! pieces ([`output`]). Responses are kept per tenant ([`store`]) for
//! `previous_response_id` unless `store: false`.

mod input;
mod output;
mod page;
mod request;
mod store;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use spec_text::Message;

use super::api::ApiError;
use super::chat_turn::{self, ChatTurn, TurnEvent, TurnStream};
use super::openai::{call_id, spec_json, timings_json};
use super::routes::{self, now, AppState};
use super::sse::NamedSource;
use output::{Event, Output};
use page::Page;
use request::ResponsesRequest;
pub use store::ResponseStore;
use store::{Missing, Stored};

/// A fresh response id: `resp_` and 24 random hex digits.
fn response_id() -> String {
    format!("resp_{}", call_id().trim_start_matches("call_"))
}

/// The 404 of a response this tenant does not have.
fn not_found(id: &str, param: Option<&'static str>, code: &'static str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no response with id `{id}` is stored for this key (never stored, `store: false`, deleted, or evicted from the server's store)"),
        kind: "invalid_request_error",
        param,
        code: Some(code),
    }
}

/// What every form of one response repeats.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    echo: Map<String, Value>,
}

impl Head {
    /// The response object with `status`, `output` and `extra` fields.
    fn response(&self, status: &str, output: Vec<Value>, extra: Value) -> Value {
        let mut r = Map::new();
        r.extend([
            ("id".to_owned(), json!(self.id)),
            ("object".to_owned(), json!("response")),
            ("created_at".to_owned(), json!(self.created_at)),
            ("status".to_owned(), json!(status)),
            ("model".to_owned(), json!(self.model)),
            ("output".to_owned(), Value::Array(output)),
            ("error".to_owned(), Value::Null),
            ("incomplete_details".to_owned(), Value::Null),
            ("usage".to_owned(), Value::Null),
        ]);
        r.extend(self.echo.clone());
        if let Value::Object(extra) = extra {
            r.extend(extra);
        }
        Value::Object(r)
    }
}

/// What is kept of a finished response.
struct Keep {
    tenant: Option<String>,
    previous: Option<String>,
    /// This turn's input messages (without the instructions).
    input: Vec<Message>,
    /// This turn's input items, as listed.
    input_items: Vec<Value>,
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parsed: Result<Json<ResponsesRequest>, JsonRejection>,
) -> Response {
    match start(state, headers, parsed).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// A request checked and translated: the turn to run, this turn's own
/// input messages (what a stored response keeps), and the rest.
struct Prepared {
    /// The response's id, chosen before it runs (its input items carry it).
    id: String,
    tenant: Option<String>,
    turn: ChatTurn,
    input: Vec<Message>,
    input_items: Vec<Value>,
    common: super::api::Common,
    echo: Map<String, Value>,
    store: bool,
    previous: Option<String>,
}

/// Authentication, the body, its checks and the conversation it
/// continues; 400s are counted as bad requests.
fn prepare(
    state: &AppState,
    headers: &HeaderMap,
    parsed: Result<Json<ResponsesRequest>, JsonRejection>,
) -> Result<Prepared, ApiError> {
    let tenant = routes::check_auth(state, headers)?;
    let counted = |e: ApiError| {
        if e.status == StatusCode::BAD_REQUEST {
            state.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
        }
        e
    };
    let req = routes::body(parsed).map_err(counted)?;
    let checked = request::check(&req).map_err(counted)?;
    let history = match &checked.previous_response_id {
        None => Vec::new(),
        Some(id) => state
            .responses
            .conversation(tenant.as_deref(), id)
            .map_err(|missing| match missing {
                Missing::NotFound(id) => not_found(
                    &id,
                    Some("previous_response_id"),
                    "previous_response_not_found",
                ),
                Missing::Broken { id, missing } => ApiError::invalid(
                    format!("the conversation of `{id}` cannot be rebuilt: its earlier response `{missing}` is no longer stored"),
                    Some("previous_response_id"),
                ),
            })?,
    };
    let input = input::messages(req.input.as_ref(), &history).map_err(counted)?;
    let mut messages = Vec::with_capacity(history.len() + input.len() + 1);
    if let Some(instructions) = &checked.instructions {
        messages.push(Message::system(instructions.clone()));
    }
    messages.extend(history);
    messages.extend(input.iter().cloned());
    let turn = ChatTurn {
        tools: checked.tools,
        tool_choice: checked.tool_choice,
        parallel_tool_calls: checked.parallel_tool_calls,
        template_kwargs: checked.template_kwargs,
        logprobs: checked.logprobs,
        truncate: checked.truncate,
        ..ChatTurn::new(messages)
    };
    let id = response_id();
    let input_items = req
        .input
        .as_ref()
        .map(|i| input::items(i, &id))
        .unwrap_or_default();
    Ok(Prepared {
        id,
        tenant,
        turn,
        input,
        input_items,
        common: checked.common,
        echo: checked.echo,
        store: checked.store,
        previous: checked.previous_response_id,
    })
}

/// An error of the checks every route shares, naming this API's fields.
fn own_names(mut e: ApiError) -> ApiError {
    if e.param == Some("response_format") {
        e.param = Some("text");
        e.message = e.message.replace("`response_format", "`text.format");
    } else if e.param == Some("max_tokens") {
        e.param = Some("max_output_tokens");
        e.message = e.message.replace("max_tokens", "max_output_tokens");
    }
    e
}

async fn start(
    state: Arc<AppState>,
    headers: HeaderMap,
    parsed: Result<Json<ResponsesRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let p = prepare(&state, &headers, parsed)?;
    let stream =
        chat_turn::start_turn(Arc::clone(&state), p.tenant.clone(), p.turn, p.common, None)
            .await
            .map_err(own_names)?;
    let head = Head {
        id: p.id,
        created_at: now(),
        model: state.model_id.clone(),
        echo: p.echo,
    };
    let keep = (p.store && state.responses.enabled()).then_some(Keep {
        tenant: p.tenant,
        previous: p.previous,
        input: p.input,
        input_items: p.input_items,
    });
    let relay = Relay {
        state: Arc::clone(&state),
        output: Output::new(&head.id),
        head,
        turn: stream,
        keep,
        ended: None,
    };
    if relay.turn.params().stream {
        Ok(streamed(relay))
    } else {
        whole(relay).await.map(|r| Json(r).into_response())
    }
}

/// `POST /v1/responses/input_tokens`: `{"object": "response.input_tokens",
/// "input_tokens"}` of the prompt the same request would run (instructions,
/// the continued conversation, tools and template included), nothing
/// generated.
pub async fn input_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parsed: Result<Json<ResponsesRequest>, JsonRejection>,
) -> Response {
    let p = match prepare(&state, &headers, parsed) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = super::admission::check_model(&state, p.common.model.as_deref()) {
        return e.into_response();
    }
    // What the answer would leave room for: the request's own
    // `max_output_tokens`, or the server's default.
    let max_tokens = p
        .common
        .max_tokens
        .and_then(|m| usize::try_from(m).ok())
        .unwrap_or(state.defaults.max_tokens);
    let rendering = {
        let state = Arc::clone(&state);
        tokio::task::spawn_blocking(move || chat_turn::render_prompt(&state, &p.turn, max_tokens))
    };
    match rendering.await {
        Ok(Ok(prompt)) => {
            Json(json!({"object": "response.input_tokens", "input_tokens": prompt.len()}))
                .into_response()
        }
        Ok(Err(e)) => own_names(e).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering a prompt panicked");
            ApiError::internal("rendering the prompt failed").into_response()
        }
    }
}

/// A running response: the turn, its output machine, what to keep.
struct Relay {
    state: Arc<AppState>,
    head: Head,
    output: Output,
    turn: TurnStream,
    keep: Option<Keep>,
    /// The final response object, once the turn ended.
    ended: Option<Value>,
}

impl super::sse::NamedSource for Relay {
    /// `response.created` and `response.in_progress`.
    fn start(&mut self) -> Vec<Event> {
        let snapshot = self.head.response("in_progress", Vec::new(), json!({}));
        vec![
            self.output
                .event("response.created", json!({"response": snapshot.clone()})),
            self.output
                .event("response.in_progress", json!({"response": snapshot})),
        ]
    }

    /// The events of the next engine event; `None` once the turn ended.
    async fn next(&mut self) -> Option<Result<Vec<Event>, ApiError>> {
        if self.ended.is_some() {
            return None;
        }
        loop {
            let Some(event) = self.turn.recv().await else {
                return Some(Err(ApiError::engine_stopped()));
            };
            return Some(Ok(match event {
                TurnEvent::Logprobs(lps) => {
                    let entries = super::logprobs::entries(&self.state.tokenizer, &lps);
                    self.output.logprobs(entries);
                    continue;
                }
                TurnEvent::Piece(piece) => self.output.piece(&piece),
                TurnEvent::Done(done) => self.finish(&done),
                TurnEvent::Error(e) => return Some(Err(e)),
            }));
        }
    }

    /// `response.failed`, for an error after the stream started.
    fn failure(&mut self, e: &ApiError) -> Event {
        let error = json!({"code": e.code.unwrap_or("server_error"), "message": e.message});
        let response = self
            .head
            .response("failed", self.output.items(), json!({"error": error}));
        self.output
            .event("response.failed", json!({"response": response}))
    }
}

impl Relay {
    /// The last events: the open item closed, `response.completed` (or
    /// `response.incomplete` when `max_output_tokens` cut it); the
    /// response kept when asked to.
    fn finish(&mut self, done: &super::worker::Done) -> Vec<Event> {
        let complete = done.finish_reason != "length";
        let mut events = self.output.finish(complete);
        let reasoning = self.output.reasoning();
        let reasoning_tokens = if reasoning.is_empty() {
            0
        } else {
            // The reasoning text encoded again: the tokens it took, but for
            // a merge across its boundary.
            self.state
                .tokenizer
                .encode(&reasoning, false)
                .map_or(0, |t| t.len())
                .min(done.completion_tokens)
        };
        let usage = json!({
            "input_tokens": done.prompt_tokens,
            "input_tokens_details": {"cached_tokens": done.cached_tokens},
            "output_tokens": done.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        });
        let (status, kind, details) = if complete {
            ("completed", "response.completed", Value::Null)
        } else {
            (
                "incomplete",
                "response.incomplete",
                json!({"reason": "max_output_tokens"}),
            )
        };
        let response = self.head.response(
            status,
            self.output.items(),
            json!({"usage": usage, "incomplete_details": details, "completed_at": now(),
                "speculative": spec_json(done), "timings": timings_json(done)}),
        );
        if let Some(keep) = self.keep.take() {
            let mut messages = keep.input;
            messages.push(self.output.message());
            self.state.responses.put(
                &self.head.id,
                Stored {
                    tenant: keep.tenant,
                    response: response.clone(),
                    previous: keep.previous,
                    messages,
                    input_items: keep.input_items,
                },
            );
        }
        events.push(
            self.output
                .event(kind, json!({"response": response.clone()})),
        );
        self.ended = Some(response);
        events
    }
}

/// A non-streamed answer: the turn run to its end, the final response.
async fn whole(mut relay: Relay) -> Result<Value, ApiError> {
    relay.start();
    while let Some(step) = relay.next().await {
        step?;
    }
    relay
        .ended
        .take()
        .ok_or_else(|| ApiError::internal("the request ended without its end"))
}

/// A streamed answer: `response.created`, `response.in_progress`, the
/// items' events as pieces come, `response.completed` (or `.incomplete`;
/// `response.failed` after an error). A client gone cancels the request.
fn streamed(relay: Relay) -> Response {
    super::sse::relay_named(relay)
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    by_id(&state, &headers, &id, |store, tenant| {
        store.get(tenant, &id)
    })
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    by_id(&state, &headers, &id, |store, tenant| {
        store
            .delete(tenant, &id)
            .then(|| json!({"id": id, "object": "response", "deleted": true}))
    })
}

/// `GET /v1/responses/{id}/input_items`: the response's input items, a
/// page of them (`order` `desc` by default, `limit` 1 to 100, default 20,
/// `after` / `before` an item id), as OpenAI's list object.
pub async fn input_items(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let tenant = match routes::check_auth(&state, &headers) {
        Ok(tenant) => tenant,
        Err(e) => return e.into_response(),
    };
    let page = match Page::of(&query) {
        Ok(page) => page,
        Err(e) => return e.into_response(),
    };
    let Some(items) = state.responses.input_items(tenant.as_deref(), &id) else {
        return not_found(&id, None, "not_found").into_response();
    };
    match page.list(items) {
        Ok(list) => Json(list).into_response(),
        Err(e) => e.into_response(),
    }
}

/// What `act` answers for the request's tenant, or the 404 of a response
/// it does not have.
fn by_id(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    act: impl FnOnce(&ResponseStore, Option<&str>) -> Option<Value>,
) -> Response {
    match routes::check_auth(state, headers) {
        Err(e) => e.into_response(),
        Ok(tenant) => match act(&state.responses, tenant.as_deref()) {
            Some(answer) => Json(answer).into_response(),
            None => not_found(id, None, "not_found").into_response(),
        },
    }
}
