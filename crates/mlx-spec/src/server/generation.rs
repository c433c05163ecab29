//! One request's generation, whatever the API: admitted, its prompt
//! prepared off the async workers (a render, a grammar's compilation),
//! submitted, then read step by step until its end or its deadline
//! (`--request-timeout`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::admission::{admit, refused_input, submit, Place};
use super::api::{ApiError, Common, Params};
use super::logprobs::TokenLogprob;
use super::routes::AppState;
use super::worker::{CancelOnDrop, Done, Event};

/// What a request's preparation hands the engine.
pub struct Prepared {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// What the output must match (`response_format`, tool calls).
    pub constraint: Option<Box<dyn spec_core::Constraint>>,
    /// Decode special tokens into the text (a parser reads markers some
    /// vocabularies hold as special tokens); otherwise they are skipped.
    pub keep_special_tokens: bool,
}

/// One step of a generation.
#[derive(Debug)]
pub enum Step {
    /// Text, with the log-probabilities of the tokens it completes (when
    /// asked for).
    Text(String, Vec<TokenLogprob>),
    /// The end.
    Done(Box<Done>),
    /// The request failed (the engine, its own input refused on the engine
    /// thread, its deadline); nothing follows.
    Failed(ApiError),
}

/// A request running on the engine: its steps, its cancellation (when
/// dropped), its place in the in-flight gauge.
pub struct Generation {
    /// The request's validated parameters.
    pub params: Params,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    rx: mpsc::UnboundedReceiver<Event>,
    _cancel: CancelOnDrop,
    _in_flight: InFlight,
    deadline: Instant,
    limit: Duration,
    ended: bool,
}

/// Decrements the in-flight gauge when the request's answer (or stream)
/// is dropped.
struct InFlight(Arc<AppState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The answer to a request that ran past `--request-timeout`.
pub fn timed_out(limit: Duration) -> ApiError {
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

/// Admits a request (in `place` when it holds one already), runs
/// `prepare` on a blocking thread (it gets the
/// validated parameters and returns the prompt, the constraint and
/// whatever the caller needs besides), and submits it. A bad request is
/// refused before anything reaches the engine.
pub async fn launch<T: Send + 'static>(
    state: &Arc<AppState>,
    tenant: Option<String>,
    common: &Common,
    logprobs: Option<usize>,
    place: Option<Place>,
    prepare: impl FnOnce(&AppState, &Params) -> Result<(Prepared, T), ApiError> + Send + 'static,
) -> Result<(Generation, T), ApiError> {
    let deadline = Instant::now() + state.request_timeout;
    let refused = |e: ApiError| {
        if e.status == StatusCode::BAD_REQUEST || e.status == StatusCode::NOT_FOUND {
            state.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
        }
        e
    };
    let admitted = admit(state, tenant, common, logprobs, place).map_err(refused)?;
    // The prompt's render and the constraint's compilation, off the async
    // workers: a bad schema or grammar is a 400 before the request joins.
    // Past the deadline `limit_time` drops this future; the render runs
    // on, its fuel bounding it.
    let preparing = {
        let state = Arc::clone(state);
        let params = admitted.params.clone();
        tokio::task::spawn_blocking(move || prepare(&state, &params))
    };
    let (prepared, extra) = match preparing.await {
        Ok(Ok(prepared)) => prepared,
        Ok(Err(e)) => return Err(refused(e)),
        Err(e) => {
            tracing::error!(error = %e, "preparing a prompt panicked");
            return Err(ApiError::internal("preparing the prompt failed"));
        }
    };
    let prompt_tokens = prepared.prompt.len();
    let (params, rx, cancel) = submit(state, admitted, prepared).map_err(refused)?;
    state.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
    let generation = Generation {
        params,
        prompt_tokens,
        rx,
        _cancel: cancel,
        _in_flight: InFlight(Arc::clone(state)),
        deadline,
        limit: state.request_timeout,
        ended: false,
    };
    Ok((generation, extra))
}

impl Generation {
    /// The next step; `None` once the request has ended (after its `Done`
    /// or `Failed`). Past the deadline: `Failed` with a 504, and the
    /// request is cancelled when this is dropped.
    pub async fn next(&mut self) -> Option<Step> {
        if self.ended {
            return None;
        }
        let event = tokio::select! {
            event = self.rx.recv() => event,
            () = tokio::time::sleep_until(self.deadline) => {
                self.ended = true;
                return Some(Step::Failed(timed_out(self.limit)));
            }
        };
        let step = match event {
            Some(Event::Text(text, logprobs)) => return Some(Step::Text(text, logprobs)),
            Some(Event::Done(done)) => Step::Done(done),
            Some(Event::Error(e)) => Step::Failed(ApiError::internal(e)),
            Some(Event::Invalid(e)) => Step::Failed(refused_input(&e)),
            None => Step::Failed(ApiError::engine_stopped()),
        };
        self.ended = true;
        Some(step)
    }
}
