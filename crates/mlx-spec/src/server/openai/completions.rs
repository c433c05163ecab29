//! `POST /v1/completions`: raw prompts (texts or token ids, one or a
//! list), each answered `n` times, their texts back (the prompt first with
//! `echo`; the legacy `logprobs` columns when asked for), streamed or not.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::shape::{spec_json, spec_json_of, timings_json, timings_json_of, usage_of};
use crate::server::admission::take_places;
use crate::server::api::{ApiError, CompletionRequest, Params, PromptInput};
use crate::server::choices::{fan_in, MAX_CHOICES};
use crate::server::generation::{launch, Generation, Prepared, Step};
use crate::server::logprobs::{self, CharOffset, TokenLogprob};
use crate::server::routes::{body, check_auth, now, request_id, AppState};
use crate::server::worker::Done;
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
    // `echo` with `logprobs` scores the prompt too (whole answers only:
    // the scores come with each choice's end).
    let score_prompt = req.echo && logprobs.is_some();
    if score_prompt && req.common.stream {
        return Err(ApiError::invalid(
            "`echo` with `logprobs` is answered whole: not with `stream`",
            Some("echo"),
        ));
    }
    let mut common = req.common.clone();
    common.score_prompt = score_prompt;
    let prompts = req.prompt.inputs(state.vocab_size)?;
    let n = common.choice_count()?;
    let candidates = req.candidates(n, common.stream)?;
    if prompts.len() * candidates > MAX_CHOICES {
        return Err(ApiError::invalid(
            format!(
                "{} prompts with {candidates} candidates each (`n`, `best_of`) make {}; at most {MAX_CHOICES}",
                prompts.len(),
                prompts.len() * candidates
            ),
            Some(if candidates > n { "best_of" } else { "n" }),
        ));
    }
    // Every candidate's place first (all or none), so a refused request
    // holds nothing; then each starts in its own.
    let total = prompts.len() * candidates;
    let mut places = take_places(&state, tenant.as_deref(), total)?.into_iter();
    let mut generations = Vec::with_capacity(total);
    let mut echoes = Vec::with_capacity(total);
    for input in &prompts {
        for j in 0..candidates {
            let input = input.clone();
            let (generation, echo) = launch(
                &state,
                tenant.clone(),
                &common.for_choice(j),
                logprobs,
                places.next(),
                move |state, params| prepare(state, params, input),
            )
            .await?;
            generations.push(generation);
            echoes.push(if req.echo { echo } else { Echo::default() });
        }
    }
    let head = Head {
        id: request_id("cmpl"),
        created: now(),
        model: state.model_id.clone(),
        per_prompt: candidates,
        returned: n,
    };
    let params = generations[0].params.clone();
    if params.stream {
        Ok(streamed(&state, head, &params, generations, echoes))
    } else {
        whole(&state, head, &params, generations, echoes).await
    }
}

/// What `echo` puts before a choice's answer.
#[derive(Default)]
struct Echo {
    /// The prompt's text.
    text: String,
    /// Its tokens (kept when the prompt is scored).
    tokens: Vec<u32>,
}

/// One choice's prompt tokens, its constraint, and its echo.
fn prepare(
    state: &AppState,
    params: &Params,
    input: PromptInput,
) -> Result<(Prepared, Echo), ApiError> {
    let (prompt, text) = match input {
        PromptInput::Text(text) => {
            let prompt = state
                .tokenizer
                .encode(&text, true)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?;
            (prompt, text)
        }
        PromptInput::Tokens(ids) => {
            let text = state
                .tokenizer
                .decode(&ids, true)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?;
            (ids, text)
        }
    };
    let env = state.grammar.as_deref().map_err(String::as_str);
    let constraint = response_format::constraint_of(env, &params.response_format)?;
    let echo = Echo {
        text,
        tokens: if params.prompt_logprobs.is_some() {
            prompt.clone()
        } else {
            Vec::new()
        },
    };
    let prepared = Prepared {
        prompt,
        constraint,
        keep_special_tokens: false,
    };
    Ok((prepared, echo))
}

/// What every answer and chunk repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    /// Candidates run per prompt (`best_of`, else `n`).
    per_prompt: usize,
    /// Choices returned per prompt (`n`).
    returned: usize,
}

impl Head {
    fn chunk(&self, index: usize, text: &str, finish: Option<&str>, lps: Value) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": lps}]})
    }
}

/// One choice's answer as it comes in.
#[derive(Default)]
struct Answer {
    text: String,
    lps: Vec<TokenLogprob>,
    done: Option<Box<Done>>,
}

/// The answer in one piece.
async fn whole(
    state: &AppState,
    head: Head,
    params: &Params,
    generations: Vec<Generation>,
    echoes: Vec<Echo>,
) -> Result<Response, ApiError> {
    let wants_logprobs = params.logprobs.is_some();
    let mut answers: Vec<Answer> = echoes
        .iter()
        .map(|echo| Answer {
            text: echo.text.clone(),
            ..Answer::default()
        })
        .collect();
    let mut events = fan_in(generations);
    while let Some((i, step)) = events.recv().await {
        let answer = &mut answers[i];
        match step {
            Step::Text(t, l) => {
                answer.text.push_str(&t);
                answer.lps.extend(l);
            }
            Step::Done(done) => answer.done = Some(done),
            Step::Failed(e) => return Err(e),
        }
    }
    let mut choices = Vec::with_capacity(answers.len());
    let mut dones = Vec::with_capacity(answers.len());
    for (answer, echo) in answers.iter().zip(&echoes) {
        let done = answer
            .done
            .as_deref()
            .ok_or_else(ApiError::engine_stopped)?;
        let lps = if wants_logprobs {
            let mut offset = CharOffset::default();
            let prompt = (!echo.tokens.is_empty()).then(|| {
                let scores = &done.prompt_logprobs;
                logprobs::prompt_json(&state.tokenizer, &echo.tokens, scores, &mut offset)
            });
            let answer = logprobs::completion_json(&state.tokenizer, &answer.lps, &mut offset);
            match prompt {
                Some(prompt) => logprobs::join_columns(prompt, answer),
                None => answer,
            }
        } else {
            Value::Null
        };
        choices.push(json!({"text": answer.text,
            "finish_reason": done.finish_reason, "logprobs": lps}));
        dones.push(done);
    }
    let choices = best_of(choices, &dones, head.per_prompt, head.returned);
    Ok(Json(
        json!({"id": head.id, "object": "text_completion", "created": head.created,
        "model": head.model, "choices": choices, "usage": usage_of(&dones, head.per_prompt),
        "speculative": spec_json_of(&dones), "timings": timings_json_of(&dones)}),
    )
    .into_response())
}

/// Each prompt's `returned` choices among its `per_prompt` candidates (in
/// order, `per_prompt` a prompt): all of them when they are as many, else
/// those with the highest log-probability per token, best first (an empty
/// completion last), numbered in order.
fn best_of(
    candidates: Vec<Value>,
    dones: &[&Done],
    per_prompt: usize,
    returned: usize,
) -> Vec<Value> {
    let per_token = |d: &Done| match d.completion_tokens {
        0 => f64::NEG_INFINITY,
        k => d.logprob_sum / k as f64,
    };
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    if returned < per_prompt {
        for group in order.chunks_mut(per_prompt.max(1)) {
            group.sort_by(|&a, &b| per_token(dones[b]).total_cmp(&per_token(dones[a])));
        }
    }
    let mut candidates: Vec<Option<Value>> = candidates.into_iter().map(Some).collect();
    order
        .chunks(per_prompt.max(1))
        .flat_map(|group| group.iter().take(returned))
        .enumerate()
        .filter_map(|(index, &i)| {
            let mut choice = candidates[i].take()?;
            choice["index"] = json!(index);
            Some(choice)
        })
        .collect()
}

/// The answer as server-sent chunks: each choice's echoed prompt first
/// (with `echo`), its text as it comes, its finish chunk (its own
/// `speculative` and `timings`); usage when asked for once every choice
/// has finished; `[DONE]`.
fn streamed(
    state: &AppState,
    head: Head,
    params: &Params,
    generations: Vec<Generation>,
    echoes: Vec<Echo>,
) -> Response {
    let include_usage = params.include_usage;
    let wants_logprobs = params.logprobs.is_some();
    let tokenizer = Arc::clone(&state.tokenizer);
    sse::respond(move |sink| async move {
        for (i, echo) in echoes.iter().enumerate() {
            let echo = &echo.text;
            if !echo.is_empty()
                && !sink
                    .data(head.chunk(i, echo, None, Value::Null).to_string())
                    .await
            {
                return;
            }
        }
        // Where each choice's next token's text starts (`text_offset`).
        let mut offsets: Vec<CharOffset> = echoes.iter().map(|_| CharOffset::default()).collect();
        let mut dones: Vec<Option<Box<Done>>> = echoes.iter().map(|_| None).collect();
        let mut events = fan_in(generations);
        loop {
            let step = tokio::select! {
                step = events.recv() => step,
                () = sink.closed() => return,
            };
            let Some((i, step)) = step else { break };
            let out: Vec<Value> = match step {
                Step::Text(t, l) => {
                    let lps = if wants_logprobs {
                        logprobs::completion_json(&tokenizer, &l, &mut offsets[i])
                    } else {
                        Value::Null
                    };
                    vec![head.chunk(i, &t, None, lps)]
                }
                Step::Done(done) => {
                    let mut last = head.chunk(i, "", Some(done.finish_reason), Value::Null);
                    last["speculative"] = spec_json(&done);
                    last["timings"] = timings_json(&done);
                    dones[i] = Some(done);
                    vec![last]
                }
                Step::Failed(e) => vec![e.body()],
            };
            for v in out {
                if !sink.data(v.to_string()).await {
                    return;
                }
            }
        }
        let dones: Option<Vec<&Done>> = dones.iter().map(|d| d.as_deref()).collect();
        if let (true, Some(dones)) = (include_usage, dones) {
            let mut u = head.chunk(0, "", None, Value::Null);
            u["choices"] = json!([]);
            u["usage"] = usage_of(&dones, head.per_prompt);
            if !sink.data(u.to_string()).await {
                return;
            }
        }
        let _ = sink.data("[DONE]".to_owned()).await;
    })
}
