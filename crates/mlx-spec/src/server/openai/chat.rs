//! `POST /v1/chat/completions`: the request turned into a [`ChatTurn`],
//! run through the shared chat path, and answered in OpenAI's shapes,
//! whole or as a stream of chunks.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use spec_agent::{Parsed, Piece};

use super::chat_request::ChatRequest;
use super::chat_shape::{delta, finish_reason, message, CallIds};
use super::shape::{spec_json, timings_json, usage};
use crate::server::api::ApiError;
use crate::server::chat_turn::{start_turn, TurnEvent, TurnStream};
use crate::server::logprobs::{self, TokenLogprob};
use crate::server::routes::{body, check_auth, now, request_id, AppState};
use crate::server::sse;

/// The handler.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parsed: Result<Json<ChatRequest>, JsonRejection>,
) -> Response {
    match run(state, headers, parsed).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// What every chunk and answer of one response repeats.
#[derive(Clone)]
struct Head {
    id: String,
    created: u64,
    model: String,
}

async fn run(
    state: Arc<AppState>,
    headers: HeaderMap,
    parsed: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let tenant = check_auth(&state, &headers)?;
    let req = body(parsed)?;
    let logprobs = logprobs::chat_request(req.logprobs.as_ref(), req.top_logprobs.as_ref())?;
    let turn = req.turn(logprobs)?;
    let stream = start_turn(Arc::clone(&state), tenant, turn, req.common).await?;
    let head = Head {
        id: request_id("chatcmpl"),
        created: now(),
        model: state.model_id.clone(),
    };
    if stream.params().stream {
        Ok(streamed(state, head, stream))
    } else {
        whole(&state, head, stream).await
    }
}

/// The answer in one piece.
async fn whole(state: &AppState, head: Head, mut stream: TurnStream) -> Result<Response, ApiError> {
    let wants_logprobs = stream.params().logprobs.is_some();
    let mut parsed = Parsed::default();
    let mut lps: Vec<TokenLogprob> = Vec::new();
    while let Some(event) = stream.recv().await {
        match event {
            TurnEvent::Piece(piece) => parsed.push(&piece),
            TurnEvent::Logprobs(l) => lps.extend(l),
            TurnEvent::Error(e) => return Err(e),
            TurnEvent::Done(done) => {
                let lps = if wants_logprobs {
                    logprobs::chat_json(&state.tokenizer, &lps)
                } else {
                    Value::Null
                };
                let choice = json!({"index": 0, "message": message(&parsed, &mut CallIds::default()),
                    "finish_reason": finish_reason(done.finish_reason, parsed.calls.len()),
                    "logprobs": lps});
                return Ok(Json(json!({"id": head.id, "object": "chat.completion",
                    "created": head.created, "model": head.model, "choices": [choice],
                    "usage": usage(&done), "speculative": spec_json(&done), "timings": timings_json(&done)}))
                .into_response());
            }
        }
    }
    Err(ApiError::engine_stopped())
}

fn chunk(head: &Head, delta: Value, finish: Option<&str>, lps: Value) -> Value {
    json!({"id": head.id, "object": "chat.completion.chunk", "created": head.created,
        "model": head.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps}]})
}

/// The answer as server-sent chunks: a role chunk, one chunk per piece
/// (log-probabilities ride on the next chunk after their tokens), the
/// finish chunk, usage when asked for, `[DONE]`.
fn streamed(state: Arc<AppState>, head: Head, mut stream: TurnStream) -> Response {
    let include_usage = stream.params().include_usage;
    let wants_logprobs = stream.params().logprobs.is_some();
    let tokenizer = Arc::clone(&state.tokenizer);
    sse::respond(move |sink| async move {
        let role = chunk(
            &head,
            json!({"role": "assistant", "content": ""}),
            None,
            Value::Null,
        );
        if !sink.data(role.to_string()).await {
            return;
        }
        let mut ids = CallIds::default();
        let mut calls = 0;
        let mut held: Vec<TokenLogprob> = Vec::new();
        let take = |held: &mut Vec<TokenLogprob>| {
            if wants_logprobs && !held.is_empty() {
                logprobs::chat_json(&tokenizer, &std::mem::take(held))
            } else {
                Value::Null
            }
        };
        loop {
            let event = tokio::select! {
                event = stream.recv() => event,
                () = sink.closed() => return,
            };
            let Some(event) = event else { break };
            let out: Vec<Value> = match event {
                TurnEvent::Logprobs(l) => {
                    held.extend(l);
                    continue;
                }
                TurnEvent::Piece(piece) => {
                    if matches!(piece, Piece::CallStart { .. }) {
                        calls += 1;
                    }
                    match delta(&piece, &mut ids) {
                        Some(d) => vec![chunk(&head, d, None, take(&mut held))],
                        None => continue,
                    }
                }
                TurnEvent::Done(done) => {
                    let mut v = Vec::new();
                    if !held.is_empty() {
                        v.push(chunk(&head, json!({}), None, take(&mut held)));
                    }
                    let reason = finish_reason(done.finish_reason, calls);
                    let mut last = chunk(&head, json!({}), Some(reason), Value::Null);
                    last["speculative"] = spec_json(&done);
                    last["timings"] = timings_json(&done);
                    v.push(last);
                    if include_usage {
                        let mut u = chunk(&head, json!({}), None, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage(&done);
                        v.push(u);
                    }
                    v
                }
                TurnEvent::Error(e) => vec![e.body()],
            };
            for v in out {
                if !sink.data(v.to_string()).await {
                    return;
                }
            }
        }
        let _ = sink.data("[DONE]".to_owned()).await;
    })
}
