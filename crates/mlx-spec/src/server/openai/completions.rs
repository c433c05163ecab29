//! `POST /v1/completions`: a raw prompt, its text back (the legacy
//! `logprobs` columns when asked for), streamed or not.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::shape::{spec_json, timings_json, usage};
use crate::server::api::{ApiError, CompletionRequest, Prompt};
use crate::server::generation::{launch, Prepared, Step};
use crate::server::logprobs::{self, CharOffset};
use crate::server::routes::{body, check_auth, now, request_id, AppState};
use crate::server::{response_format, sse};

/// The handler.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    parsed: Result<Json<CompletionRequest>, JsonRejection>,
) -> Response {
    match run(state, headers, parsed).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn run(
    state: Arc<AppState>,
    headers: HeaderMap,
    parsed: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let tenant = check_auth(&state, &headers)?;
    let req = body(parsed)?;
    let logprobs = logprobs::completion_request(req.logprobs.as_ref())?;
    let text = match &req.prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Texts(v) if v.len() == 1 => v[0].clone(),
        Prompt::Texts(_) => {
            return Err(ApiError::invalid(
                "batched prompts are not supported: send one prompt",
                Some("prompt"),
            ))
        }
    };
    let (mut generation, ()) = launch(
        &state,
        tenant,
        &req.common,
        logprobs,
        move |state, params| {
            let prompt = state
                .tokenizer
                .encode(&text, true)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?;
            let env = state.grammar.as_deref().map_err(String::as_str);
            let constraint = response_format::constraint_of(env, &params.response_format)?;
            let prepared = Prepared {
                prompt,
                constraint,
                keep_special_tokens: false,
            };
            Ok((prepared, ()))
        },
    )
    .await?;
    let id = request_id("cmpl");
    let created = now();
    let model = state.model_id.clone();
    let wants_logprobs = generation.params.logprobs.is_some();
    if !generation.params.stream {
        let (text, lps, done) = generation.collect().await?;
        let lps = if wants_logprobs {
            logprobs::completion_json(&state.tokenizer, &lps, &mut CharOffset::default())
        } else {
            Value::Null
        };
        let choice =
            json!({"index": 0, "text": text, "finish_reason": done.finish_reason, "logprobs": lps});
        return Ok(Json(json!({"id": id, "object": "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage(&done), "speculative": spec_json(&done), "timings": timings_json(&done)}))
        .into_response());
    }
    let include_usage = generation.params.include_usage;
    let chunk = move |text: &str, finish: Option<&str>, lps: Value| -> Value {
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": lps}]})
    };
    let tokenizer = Arc::clone(&state.tokenizer);
    Ok(sse::respond(move |sink| async move {
        // Where the next token's text starts (`text_offset`).
        let mut offset = CharOffset::default();
        loop {
            let step = tokio::select! {
                step = generation.next() => step,
                () = sink.closed() => return,
            };
            let Some(step) = step else { break };
            let out: Vec<Value> = match step {
                Step::Text(t, l) => {
                    let lps = if wants_logprobs {
                        logprobs::completion_json(&tokenizer, &l, &mut offset)
                    } else {
                        Value::Null
                    };
                    vec![chunk(&t, None, lps)]
                }
                Step::Done(done) => {
                    let mut last = chunk("", Some(done.finish_reason), Value::Null);
                    last["speculative"] = spec_json(&done);
                    last["timings"] = timings_json(&done);
                    let mut v = vec![last];
                    if include_usage {
                        let mut u = chunk("", None, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage(&done);
                        v.push(u);
                    }
                    v
                }
                Step::Failed(e) => vec![e.body()],
            };
            for v in out {
                if !sink.data(v.to_string()).await {
                    return;
                }
            }
        }
        let _ = sink.data("[DONE]".to_owned()).await;
    }))
}
