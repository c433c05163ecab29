//! The server's side of the engine facade: each request's text. The
//! engine thread decodes every emitted token and matches the stop strings
//! (so a stop ends the request at that token); a waiter thread hands the
//! request's end to its handler. A handler that goes away (a client
//! disconnect) cancels its request, which frees its row within one step.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serve_loop::{
    AdaptiveConfig, Finish, ProviderChoice, Request, ServeError, SpecConfig, StopMatcher,
};
use spec_core::{ProviderOptions, SpecStats};
use spec_text::{StreamDecoder, TextError, Tokenizer};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::api::Params;
use super::logprobs::TokenLogprob;
use super::metrics::Metrics;
use super::tenants::KeySlot;

/// Speculation a request asked for, resolved by the handler.
#[derive(Debug, Clone)]
pub struct SpecChoice {
    pub provider: String,
    /// `None`: the provider's default.
    pub num_draft: Option<usize>,
    /// Whether the adaptive controller sets each round's draft length;
    /// `false` drafts `num_draft` every round (the CLI's `--no-adaptive`).
    pub adaptive: bool,
    /// How the controller's lengths are chosen in a batch.
    pub policy: serve_loop::DraftPolicy,
    /// Per-request provider options: the engine then builds a provider with
    /// them (or reuses the one it built for the same options).
    pub options: ProviderOptions,
}

/// What a request's handler receives.
#[derive(Debug)]
pub enum Event {
    /// Text, with the log-probabilities of the tokens it completes when
    /// the request asked for them (a token whose text is held back, a
    /// piece of a character or a possible stop string, comes with the
    /// text that releases it).
    Text(String, Vec<TokenLogprob>),
    Done(Box<Done>),
    Error(String),
    /// The request's own input was refused on the engine thread (a
    /// provider could not be built for its options): a 400 whose message
    /// is the error's chain.
    Invalid(ServeError),
}

#[derive(Debug)]
pub struct Done {
    pub finish_reason: &'static str,
    /// The stop string that ended the request, when one did.
    pub stop_sequence: Option<String>,
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (not prefilled).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The sum of the emitted tokens' log-probabilities (what `best_of`
    /// ranks candidates by, per token).
    pub logprob_sum: f64,
    pub provider: Option<String>,
    pub stats: SpecStats,
    /// Whether the request came with a predicted output.
    pub predicted: bool,
    /// The prompt's tokens after the first, scored (when asked for).
    pub prompt_logprobs: Vec<serve_loop::PromptLogprob>,
    /// Where the request's time went.
    pub timings: Timings,
}

/// A finished request's wall-clock split, as the server saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// From submission to the first emitted token: waiting for a place in
    /// the batch, the prompt's prefill and the first step.
    pub prompt_seconds: f64,
    /// From the first emitted token to the end: every later token.
    pub generation_seconds: f64,
}

/// The serve loop's settings for `choice`, whose provider drafts
/// `default_num_draft` tokens unless told otherwise; rejection sampling
/// draws from `seed` (the request's sampler's).
fn spec_config(choice: &SpecChoice, default_num_draft: usize, seed: u64) -> SpecConfig {
    SpecConfig {
        num_draft: choice.num_draft.unwrap_or(default_num_draft),
        adaptive: if choice.adaptive {
            AdaptiveConfig::with_policy(choice.policy)
        } else {
            AdaptiveConfig::off()
        },
        seed,
        ..SpecConfig::default()
    }
}

/// A request's text as the engine thread produces it.
struct Text {
    decoder: StreamDecoder<'static>,
    stops: StopMatcher,
    /// A stop string ended the request.
    stopped: bool,
    /// The handler went away.
    client_gone: bool,
    error: Option<TextError>,
    /// Log-probabilities of tokens whose text has not gone out yet
    /// (`None`: the request asked for none).
    logprobs: Option<Vec<TokenLogprob>>,
    /// When the engine emitted the first token.
    first_token: Option<Instant>,
}

impl Text {
    /// The log-probabilities held back so far.
    fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        self.logprobs
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

/// Cancels its request when dropped (the handler or the stream went away);
/// harmless once the request has ended. It holds the request's place in
/// its key's count: a client that leaves frees it at once, not a step
/// later when the engine drops the row (a "stop" and a new message
/// at `--max-concurrency-per-key 1` was a 429). The server's own slot stays
/// with the engine's row until it ends.
pub struct CancelOnDrop {
    flag: Arc<AtomicBool>,
    _key: Option<KeySlot>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Relaxed);
    }
}

/// What a request needs besides its prompt.
pub struct Submission {
    pub prompt: Vec<u32>,
    /// The predicted output's tokens (`prediction`; empty: none).
    pub prediction: Vec<u32>,
    pub params: Params,
    pub spec: Option<SpecChoice>,
    /// The provider's default draft length, for `spec`.
    pub default_num_draft: usize,
    /// The tenant of the request's API key (`None`: the server has no keys).
    pub tenant: Option<String>,
    /// The request's `cache_salt`.
    pub cache_salt: Option<String>,
    /// Applied to the logits before sampling (`logit_bias`).
    pub processors: Vec<Box<dyn spec_core::LogitsProcessor + Send>>,
    /// What the output must match (`response_format`, tool calls).
    pub constraint: Option<Box<dyn spec_core::Constraint>>,
    /// Decode special tokens into the text (for an output parser that
    /// reads call or reasoning markers); otherwise they are skipped.
    pub keep_special_tokens: bool,
    /// Held until the request ends: its place in `--max-concurrency` and
    /// in its key's `--max-concurrency-per-key`.
    pub permit: (OwnedSemaphorePermit, Option<KeySlot>),
}

/// Submits a request to the engine; returns its events and the guard that
/// cancels it. Must run inside the server's runtime (the waiter is a
/// blocking task).
pub fn submit(
    engine: &serve_loop::Engine,
    tokenizer: &Arc<Tokenizer>,
    metrics: &Arc<Metrics>,
    job: Submission,
) -> Result<(mpsc::UnboundedReceiver<Event>, CancelOnDrop), ServeError> {
    let Submission {
        prompt,
        prediction,
        params,
        spec,
        default_num_draft,
        tenant,
        cache_salt,
        processors,
        constraint,
        keep_special_tokens,
        permit,
    } = job;
    let predicted = !prediction.is_empty();
    let (events, received) = mpsc::unbounded_channel();
    let text = Arc::new(Mutex::new(Text {
        decoder: StreamDecoder::shared(Arc::clone(tokenizer), !keep_special_tokens),
        stops: StopMatcher::new(params.stop.iter().cloned()),
        stopped: false,
        client_gone: false,
        error: None,
        logprobs: params.logprobs.map(|_| Vec::new()),
        first_token: None,
    }));
    let hook_text = Arc::clone(&text);
    let hook_events = events.clone();
    let on_token = move |e: &serve_loop::Emitted<'_>| {
        let token = e.token;
        let mut text = hook_text.lock().unwrap_or_else(PoisonError::into_inner);
        text.first_token.get_or_insert_with(Instant::now);
        let piece = match text.decoder.step(token) {
            Ok(piece) => piece,
            Err(e) => {
                text.error = Some(e);
                return ControlFlow::Break(());
            }
        };
        if let Some(held) = text.logprobs.as_mut() {
            held.push(TokenLogprob {
                token,
                logprob: e.logprob,
                top: e.top_logprobs.to_vec(),
            });
        }
        let (out, stopped) = text.stops.push(&piece);
        if !out.is_empty()
            && hook_events
                .send(Event::Text(out, text.take_logprobs()))
                .is_err()
        {
            text.client_gone = true;
            return ControlFlow::Break(());
        }
        text.stopped = stopped;
        if stopped {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let prompt_tokens = prompt.len();
    let request = Request {
        eos: tokenizer.eos_token_ids().iter().copied().collect(),
        sampler: params.sampler.clone(),
        speculation: spec.as_ref().map(|choice| ProviderChoice {
            id: choice.provider.clone(),
            config: spec_config(choice, default_num_draft, params.sampler.seed),
            options: choice.options.clone(),
        }),
        tenant,
        cache_salt,
        processors,
        constraint,
        top_logprobs: params.logprobs.unwrap_or(0),
        prompt_logprobs: params.prompt_logprobs,
        prediction,
        on_token: Some(Box::new(on_token)),
        ..Request::new(prompt, params.max_tokens)
    };
    let submitted = Instant::now();
    let handle = engine.submit(request)?;
    let (permit, key) = permit;
    let cancel = CancelOnDrop {
        flag: handle.cancel_flag(),
        _key: key,
    };
    let metrics = Arc::clone(metrics);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let end = match handle.wait() {
            Ok(done) => {
                let output = done.output;
                metrics
                    .prompt_tokens
                    .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
                metrics
                    .generated_tokens
                    .fetch_add(output.tokens.len() as u64, Ordering::Relaxed);
                if let Some(choice) = &spec {
                    metrics.record_speculation(&choice.provider, &output.stats);
                }
                if output.stats.masks > 0 {
                    metrics.record_constraint(&output.stats, output.tokens.len());
                }
                let mut text = text.lock().unwrap_or_else(PoisonError::into_inner);
                if text.client_gone || output.finish == Finish::Cancelled {
                    metrics.disconnects.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                if let Some(e) = text.error.take() {
                    text_failed(&e)
                } else {
                    let rest = if text.stopped {
                        String::new()
                    } else {
                        match finish_text(&mut text) {
                            Ok(rest) => rest,
                            Err(e) => {
                                let _ = events.send(text_failed(&e));
                                return;
                            }
                        }
                    };
                    let held = text.take_logprobs();
                    if !rest.is_empty() || !held.is_empty() {
                        let _ = events.send(Event::Text(rest, held));
                    }
                    Event::Done(Box::new(Done {
                        finish_reason: match output.finish {
                            Finish::MaxTokens => "length",
                            _ => "stop",
                        },
                        stop_sequence: text
                            .stopped
                            .then(|| text.stops.matched().map(str::to_owned))
                            .flatten(),
                        prompt_tokens,
                        cached_tokens: output.cached_tokens,
                        completion_tokens: output.tokens.len(),
                        logprob_sum: output.logprobs.iter().map(|&l| f64::from(l)).sum(),
                        provider: spec.map(|s| s.provider),
                        stats: output.stats,
                        prompt_logprobs: output.prompt_logprobs,
                        predicted,
                        timings: {
                            let ended = Instant::now();
                            let first = text.first_token.unwrap_or(ended);
                            Timings {
                                prompt_seconds: (first - submitted).as_secs_f64(),
                                generation_seconds: (ended - first).as_secs_f64(),
                            }
                        },
                    }))
                }
            }
            Err(e @ (ServeError::Build { .. } | ServeError::NoRollback { .. })) => {
                Event::Invalid(e)
            }
            Err(e) => engine_failed(&e),
        };
        let _ = events.send(end);
    });
    Ok((received, cancel))
}

/// The end of a request the engine failed: the whole error chain goes to
/// the log, the client's 500 names only the failing component (a chain
/// may hold file paths and internals).
pub fn engine_failed(e: &ServeError) -> Event {
    tracing::error!(error = %spec_core::error::report(e), "a request failed");
    Event::Error(public_message(e))
}

/// What a client is told of `e`: the component that failed, no chain.
pub fn public_message(e: &ServeError) -> String {
    match e {
        ServeError::Source { provider, .. } => format!("draft provider `{provider}` failed"),
        ServeError::Panicked(_) => "the engine failed and stopped serving".to_owned(),
        ServeError::Stopped => "the engine has stopped".to_owned(),
        ServeError::Load(_) => "the engine's model failed to load".to_owned(),
        ServeError::Spec(spec_core::SpecError::Model(inner)) => inner
            .downcast_ref::<spec_pipeline::PipelineError>()
            .map_or_else(
                || "the model failed on this request".to_owned(),
                pipeline_component,
            ),
        ServeError::Spec(_) | ServeError::Mlx(_) => "the model failed on this request".to_owned(),
        other => format!("the engine refused the request: {}", first_line(other)),
    }
}

/// Which part of a pipeline failed: its ranks, never MLX's text.
fn pipeline_component(e: &spec_pipeline::PipelineError) -> String {
    use spec_pipeline::PipelineError as P;
    match e {
        P::Link {
            rank, what, peer, ..
        } => format!("the pipeline failed: rank {rank} {what} rank {peer}"),
        P::Stage { rank, .. } => format!("the pipeline failed at rank {rank}"),
        P::Broken(first) => format!("the pipeline is broken ({})", pipeline_component(first)),
        _ => "the pipeline failed".to_owned(),
    }
}

/// The error's own message, without its sources.
fn first_line(e: &ServeError) -> String {
    let own = e.to_string();
    own.lines().next().unwrap_or_default().to_owned()
}

/// The end of a request whose output text could not be decoded: logged
/// whole, named to the client.
fn text_failed(e: &TextError) -> Event {
    tracing::error!(error = %spec_core::error::report(e), "decoding a request's output text failed");
    Event::Error("decoding the output text failed".to_owned())
}

/// The text held back at the end: the decoder's tail, then the stop
/// matcher's.
fn finish_text(text: &mut Text) -> Result<String, TextError> {
    let tail = text.decoder.finish()?;
    let (out, _) = text.stops.push(&tail);
    Ok(out + &text.stops.finish())
}

#[cfg(test)]
mod tests {
    use spec_core::{DraftProvider, DraftSource, SpecError, Target};

    use super::*;

    /// A provider whose default draft count is 7.
    #[derive(Debug)]
    struct Seven;

    impl DraftProvider for Seven {
        fn id(&self) -> &str {
            "seven"
        }
        fn default_num_draft(&self) -> usize {
            7
        }
        fn open<'a>(&self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
            Err(SpecError::Internal("never opened"))
        }
    }

    /// A 500's message names the component, never the chain under it
    /// (which may hold file paths); the log gets the chain.
    #[test]
    fn clients_are_told_the_component_not_the_chain() {
        let secret = "/srv/models/private/config.json: No such file or directory";
        let cases = [
            (
                ServeError::Source {
                    provider: "draft-model".into(),
                    source: SpecError::Model(secret.into()),
                },
                "draft provider `draft-model` failed",
            ),
            (
                ServeError::Spec(SpecError::Model(secret.into())),
                "the model failed on this request",
            ),
            (
                ServeError::Panicked(secret.into()),
                "the engine failed and stopped serving",
            ),
            (
                ServeError::Load(secret.into()),
                "the engine's model failed to load",
            ),
        ];
        for (error, told) in cases {
            assert!(
                spec_core::error::report(&error).contains(secret),
                "the log keeps the chain"
            );
            let message = public_message(&error);
            assert_eq!(message, told);
            match engine_failed(&error) {
                Event::Error(m) => assert_eq!(m, told),
                other => panic!("{other:?}"),
            }
        }
    }

    fn choice(num_draft: Option<usize>, adaptive: bool) -> SpecChoice {
        SpecChoice {
            provider: "seven".into(),
            num_draft,
            adaptive,
            policy: serve_loop::DraftPolicy::Goodput,
            options: ProviderOptions::new(),
        }
    }

    #[test]
    fn adaptive_false_reaches_the_serve_loop_as_a_fixed_length() {
        let fixed = spec_config(&choice(Some(4), false), Seven.default_num_draft(), 0);
        assert_eq!(fixed.num_draft, 4);
        assert_eq!(fixed.adaptive, AdaptiveConfig::off());
        assert!(!fixed.adaptive.adapt_length && !fixed.adaptive.pause);

        let adaptive = spec_config(&choice(None, true), Seven.default_num_draft(), 0);
        assert_eq!(adaptive.num_draft, 7, "the provider's default");
        assert_eq!(adaptive.adaptive, AdaptiveConfig::default());
    }
}
