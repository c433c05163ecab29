//! Anthropic's Messages API on the same engine as the OpenAI routes:
//! `POST /v1/messages` (streamed as Anthropic's named SSE events or not)
//! and `POST /v1/messages/count_tokens`. Requests translate into the chat
//! pipeline's turn ([`request`]), so batching, the prefix cache, grammars
//! and per-request `speculative` are the OpenAI routes'; answers are
//! content blocks built from its pieces ([`stream`], [`response`]).

mod content;
mod errors;
mod request;
mod response;
mod stream;
mod tools;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::admission;
use super::api::ApiError;
use super::chat_turn::{self, TurnEvent, TurnStream};
use super::routes::{self, AppState};
use super::sse::NamedSource;
pub use errors::AnthropicError;
use request::{MessagesRequest, Route};
use stream::{Ending, Event, Events};

/// Whether `path` is one of this API's routes (whose errors the server's
/// outer layers give in Anthropic's shape too).
pub fn serves(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// Authentication, the body, the translation: the turn and its fields, or
/// the error to answer (counted as a bad request when it is one).
fn accept(
    state: &AppState,
    headers: &HeaderMap,
    parsed: Result<Json<MessagesRequest>, JsonRejection>,
    route: Route,
) -> Result<(Option<String>, chat_turn::ChatTurn, super::api::Common), AnthropicError> {
    let tenant = routes::check_auth(state, headers)?;
    let checked = routes::body(parsed).and_then(|req| request::translate(&req, route));
    checked
        .map(|(turn, common)| (tenant, turn, common))
        .map_err(|e| {
            if e.status == StatusCode::BAD_REQUEST {
                state.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
            }
            AnthropicError(e)
        })
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parsed: Result<Json<MessagesRequest>, JsonRejection>,
) -> Response {
    let (tenant, turn, common) = match accept(&state, &headers, parsed, Route::Messages) {
        Ok(accepted) => accepted,
        Err(e) => return e.into_response(),
    };
    let turn = match chat_turn::start_turn(state.clone(), tenant, turn, common, None).await {
        Ok(turn) => turn,
        Err(e) => return AnthropicError(e).into_response(),
    };
    let id = response::message_id();
    let model = state.model_id.clone();
    if turn.params().stream {
        return streamed(turn, id, model);
    }
    match whole(turn, &id, &model).await {
        Ok(message) => Json(message).into_response(),
        Err(e) => AnthropicError(e).into_response(),
    }
}

/// A running turn and its event machine: the events of each engine event
/// in turn, then how it ended.
struct Relay {
    turn: TurnStream,
    machine: Events,
    model: String,
    /// The end, once it came: the reason, usage and speculation stats.
    end: Option<(Ending, serde_json::Value, serde_json::Value)>,
}

impl Relay {
    fn new(turn: TurnStream, id: &str, model: String) -> Self {
        Self {
            turn,
            machine: Events::new(id),
            model,
            end: None,
        }
    }
}

impl super::sse::NamedSource for Relay {
    /// `message_start` and a `ping`.
    fn start(&mut self) -> Vec<Event> {
        let usage = response::usage(self.turn.prompt_tokens(), 0, 0);
        self.machine.start(&self.model, usage)
    }

    /// An `error` event.
    fn failure(&mut self, e: &ApiError) -> Event {
        stream::error_event(e)
    }

    /// The events of the next engine event; `None` once the turn ended.
    async fn next(&mut self) -> Option<Result<Vec<Event>, ApiError>> {
        if self.end.is_some() {
            return None;
        }
        loop {
            let Some(event) = self.turn.recv().await else {
                return Some(Err(ApiError::engine_stopped()));
            };
            return Some(Ok(match event {
                TurnEvent::Piece(piece) => self.machine.piece(&piece),
                TurnEvent::Done(done) => {
                    let ending = Ending::new(
                        done.finish_reason,
                        done.stop_sequence.clone(),
                        self.machine.called(),
                    );
                    let usage = response::usage(
                        done.prompt_tokens,
                        done.cached_tokens,
                        done.completion_tokens,
                    );
                    let speculative = super::openai::spec_json(&done);
                    let mut events = self.machine.finish(&ending, usage.clone());
                    // The OpenAI routes' stats ride on message_delta, as on
                    // their last chunk.
                    if let Some(delta) = events.iter_mut().find(|e| e.name == "message_delta") {
                        delta.data["speculative"] = speculative.clone();
                    }
                    self.end = Some((ending, usage, speculative));
                    events
                }
                TurnEvent::Error(e) => return Some(Err(e)),
                TurnEvent::Logprobs(_) => continue,
            }));
        }
    }
}

/// A non-streamed answer: the stream's events accumulated.
async fn whole(turn: TurnStream, id: &str, model: &str) -> Result<serde_json::Value, ApiError> {
    let mut relay = Relay::new(turn, id, model.to_owned());
    let mut events = relay.start();
    while let Some(more) = relay.next().await {
        events.extend(more?);
    }
    let (ending, usage, speculative) = relay
        .end
        .ok_or_else(|| ApiError::internal("the request ended without its end"))?;
    Ok(response::message(
        id,
        model,
        response::content(&events),
        &ending,
        usage,
        speculative,
    ))
}

/// A streamed answer: `message_start`, a `ping`, the blocks' events as
/// pieces come, the end; an error after the start is an `error` event.
/// A client gone cancels the request (the turn is dropped).
fn streamed(turn: TurnStream, id: String, model: String) -> Response {
    super::sse::relay_named(Relay::new(turn, &id, model))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the prompt the
/// same request would run, rendered with its tools and system, nothing
/// generated.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parsed: Result<Json<MessagesRequest>, JsonRejection>,
) -> Response {
    let (_, turn, common) = match accept(&state, &headers, parsed, Route::CountTokens) {
        Ok(accepted) => accepted,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = admission::check_model(&state, common.model.as_deref()) {
        return AnthropicError(e).into_response();
    }
    let rendering = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || chat_turn::render_prompt(&state, &turn, 0))
    };
    match rendering.await {
        Ok(Ok(prompt)) => Json(json!({"input_tokens": prompt.len()})).into_response(),
        Ok(Err(e)) => AnthropicError(e).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering a prompt panicked");
            AnthropicError(ApiError::internal("rendering the prompt failed")).into_response()
        }
    }
}
