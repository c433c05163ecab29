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
use super::shape::{spec_json, spec_json_of, timings_json, timings_json_of, usage_of};
use crate::server::admission::take_places;
use crate::server::api::{ApiError, Params};
use crate::server::chat_turn::{start_turn, TurnEvent, TurnStream};
use crate::server::choices::fan_in;
use crate::server::logprobs::{self, TokenLogprob};
use crate::server::routes::{body, check_auth, now, request_id, AppState};
use crate::server::sse;
use crate::server::worker::Done;

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
    let n = req.common.choice_count()?;
    let turn = req.turn(logprobs)?;
    // Every choice's place first (all or none), so a refused request
    // holds nothing; then each choice starts in its own.
    let places = take_places(&state, tenant.as_deref(), n)?;
    let mut streams = Vec::with_capacity(n);
    for (i, place) in places.into_iter().enumerate() {
        let common = req.common.for_choice(i);
        let turn = turn.clone();
        let stream = start_turn(
            Arc::clone(&state),
            tenant.clone(),
            turn,
            common,
            Some(place),
        )
        .await?;
        streams.push(stream);
    }
    let head = Head {
        id: request_id("chatcmpl"),
        created: now(),
        model: state.model_id.clone(),
    };
    let params = streams[0].params().clone();
    if params.stream {
        Ok(streamed(state, head, &params, streams))
    } else {
        whole(&state, head, &params, streams).await
    }
}

/// One choice's answer as it comes in.
#[derive(Default)]
struct Answer {
    parsed: Parsed,
    lps: Vec<TokenLogprob>,
    done: Option<Box<Done>>,
}

/// The answer in one piece.
async fn whole(
    state: &AppState,
    head: Head,
    params: &Params,
    streams: Vec<TurnStream>,
) -> Result<Response, ApiError> {
    let wants_logprobs = params.logprobs.is_some();
    let mut answers: Vec<Answer> = streams.iter().map(|_| Answer::default()).collect();
    let mut events = fan_in(streams);
    while let Some((i, event)) = events.recv().await {
        let answer = &mut answers[i];
        match event {
            TurnEvent::Piece(piece) => answer.parsed.push(&piece),
            TurnEvent::Logprobs(l) => answer.lps.extend(l),
            TurnEvent::Error(e) => return Err(e),
            TurnEvent::Done(done) => answer.done = Some(done),
        }
    }
    let mut choices = Vec::with_capacity(answers.len());
    let mut dones = Vec::with_capacity(answers.len());
    for (i, answer) in answers.iter().enumerate() {
        let done = answer
            .done
            .as_deref()
            .ok_or_else(ApiError::engine_stopped)?;
        let lps = if wants_logprobs {
            logprobs::chat_json(&state.tokenizer, &answer.lps)
        } else {
            Value::Null
        };
        choices.push(
            json!({"index": i, "message": message(&answer.parsed, &mut CallIds::default()),
            "finish_reason": finish_reason(done.finish_reason, answer.parsed.calls.len()),
            "logprobs": lps}),
        );
        dones.push(done);
    }
    Ok(Json(json!({"id": head.id, "object": "chat.completion",
        "created": head.created, "model": head.model, "choices": choices,
        "usage": usage_of(&dones, dones.len()), "speculative": spec_json_of(&dones),
        "timings": timings_json_of(&dones)}))
    .into_response())
}

fn chunk(head: &Head, index: usize, delta: Value, finish: Option<&str>, lps: Value) -> Value {
    json!({"id": head.id, "object": "chat.completion.chunk", "created": head.created,
        "model": head.model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": lps}]})
}

/// One choice's stream as it goes out.
#[derive(Default)]
struct Streaming {
    ids: CallIds,
    calls: usize,
    /// Log-probabilities waiting for the next chunk.
    held: Vec<TokenLogprob>,
    done: Option<Box<Done>>,
}

/// The answer as server-sent chunks: each choice's role chunk, one chunk
/// per piece (log-probabilities ride on the next chunk after their
/// tokens), each choice's finish chunk (its own `speculative` and
/// `timings`), usage when asked for once every choice has finished,
/// `[DONE]`.
fn streamed(
    state: Arc<AppState>,
    head: Head,
    params: &Params,
    streams: Vec<TurnStream>,
) -> Response {
    let include_usage = params.include_usage;
    let wants_logprobs = params.logprobs.is_some();
    let tokenizer = Arc::clone(&state.tokenizer);
    sse::respond(move |sink| async move {
        let mut choices: Vec<Streaming> = streams.iter().map(|_| Streaming::default()).collect();
        for i in 0..choices.len() {
            let role = chunk(
                &head,
                i,
                json!({"role": "assistant", "content": ""}),
                None,
                Value::Null,
            );
            if !sink.data(role.to_string()).await {
                return;
            }
        }
        let take = |held: &mut Vec<TokenLogprob>| {
            if wants_logprobs && !held.is_empty() {
                logprobs::chat_json(&tokenizer, &std::mem::take(held))
            } else {
                Value::Null
            }
        };
        let mut events = fan_in(streams);
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = sink.closed() => return,
            };
            let Some((i, event)) = event else { break };
            let choice = &mut choices[i];
            let out: Vec<Value> = match event {
                TurnEvent::Logprobs(l) => {
                    choice.held.extend(l);
                    continue;
                }
                TurnEvent::Piece(piece) => {
                    if matches!(piece, Piece::CallStart { .. }) {
                        choice.calls += 1;
                    }
                    match delta(&piece, &mut choice.ids) {
                        Some(d) => vec![chunk(&head, i, d, None, take(&mut choice.held))],
                        None => continue,
                    }
                }
                TurnEvent::Done(done) => {
                    let mut v = Vec::new();
                    if !choice.held.is_empty() {
                        v.push(chunk(&head, i, json!({}), None, take(&mut choice.held)));
                    }
                    let reason = finish_reason(done.finish_reason, choice.calls);
                    let mut last = chunk(&head, i, json!({}), Some(reason), Value::Null);
                    last["speculative"] = spec_json(&done);
                    last["timings"] = timings_json(&done);
                    v.push(last);
                    choice.done = Some(done);
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
        let dones: Option<Vec<&Done>> = choices.iter().map(|c| c.done.as_deref()).collect();
        if let (true, Some(dones)) = (include_usage, dones) {
            let mut u = chunk(&head, 0, json!({}), None, Value::Null);
            u["choices"] = json!([]);
            u["usage"] = usage_of(&dones, dones.len());
            if !sink.data(u.to_string()).await {
                return;
            }
        }
        let _ = sink.data("[DONE]".to_owned()).await;
    })
}
