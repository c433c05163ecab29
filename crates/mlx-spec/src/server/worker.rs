//! The engine thread: owns the model and the loaded providers, runs queued
//! requests one at a time, and streams their text back. A request whose
//! client went away stops within one round (its event channel is closed).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serve_loop::{AdaptiveConfig, Finish, Request, SpecConfig, Speculation, StopMatcher};
use spec_core::{DraftProvider, ProviderOptions, SpecStats};
use spec_models::LoadedModel as Model;
use spec_text::Tokenizer;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::api::Params;
use super::metrics::Metrics;

/// Speculation a request asked for, resolved by the handler.
#[derive(Debug, Clone)]
pub struct SpecChoice {
    pub provider: String,
    /// `None`: the provider's default.
    pub num_draft: Option<usize>,
    /// Per-request provider options: a provider is then built for this
    /// request alone (cheap for prompt-lookup; reloads a drafter model).
    pub options: ProviderOptions,
}

/// A queued request.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: Params,
    pub spec: Option<SpecChoice>,
    pub events: mpsc::Sender<Event>,
    pub permit: OwnedSemaphorePermit,
}

/// What the engine sends back.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done(Done),
    Error(String),
}

#[derive(Debug)]
pub struct Done {
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub provider: Option<String>,
    pub stats: SpecStats,
}

/// The engine: model, tokenizer and the providers loaded at start.
pub struct Engine {
    pub model: Model,
    pub tokenizer: Arc<Tokenizer>,
    pub providers: BTreeMap<String, Box<dyn DraftProvider>>,
    pub metrics: Arc<Metrics>,
}

impl Engine {
    /// Serves jobs until every sender is gone.
    pub fn run(self, mut jobs: mpsc::Receiver<Job>) {
        while let Some(job) = jobs.blocking_recv() {
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            let events = job.events.clone();
            if let Err(e) = self.serve(job) {
                let _ = events.blocking_send(Event::Error(format!("{e:#}")));
            }
            // Release MLX's buffer cache between requests so memory returns
            // to its idle level.
            let _ = mlx_rs::memory::clear_cache();
        }
    }

    fn serve(&self, job: Job) -> anyhow::Result<()> {
        let Job {
            prompt,
            params,
            spec,
            events,
            permit,
        } = job;
        let _permit = permit;
        let owned;
        let speculation = match &spec {
            None => None,
            Some(choice) => {
                let provider: &dyn DraftProvider = if choice.options.is_empty() {
                    self.providers
                        .get(&choice.provider)
                        .map(|p| p.as_ref())
                        .ok_or_else(|| anyhow::anyhow!("provider {} not loaded", choice.provider))?
                } else {
                    owned =
                        serve_loop::build_provider(&choice.provider, &self.model, &choice.options)?;
                    owned.as_ref()
                };
                let num_draft = choice
                    .num_draft
                    .unwrap_or_else(|| provider.default_num_draft());
                Some(Speculation {
                    provider,
                    config: SpecConfig {
                        num_draft,
                        adaptive: AdaptiveConfig::default(),
                        ..SpecConfig::default()
                    },
                })
            }
        };
        let mut sampler = params
            .sampler
            .build(spec_core::Target::info(&self.model).vocab_size)?;
        let mut stream = self.tokenizer.stream_decoder(true);
        let mut stops = StopMatcher::new(params.stop.iter().cloned());
        let mut client_gone = false;
        let mut decode_error = None;
        let tokenizer = &self.tokenizer;
        let is_eos = |t: u32| tokenizer.is_eos(t);
        let request = Request {
            prompt: &prompt,
            max_tokens: params.max_tokens,
            is_eos: &is_eos,
            sampler: sampler.as_mut(),
            processors: &mut [],
            speculation,
            cancel: None,
        };
        let output = serve_loop::generate(&self.model, request, |token| {
            let piece = match stream.step(token) {
                Ok(p) => p,
                Err(e) => {
                    decode_error = Some(e);
                    return ControlFlow::Break(());
                }
            };
            let (text, stopped) = stops.push(&piece);
            if !text.is_empty() && events.blocking_send(Event::Text(text)).is_err() {
                client_gone = true;
                return ControlFlow::Break(());
            }
            if stopped {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if let Some(e) = decode_error {
            return Err(e.into());
        }
        self.metrics
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Ordering::Relaxed);
        self.metrics
            .generated_tokens
            .fetch_add(output.tokens.len() as u64, Ordering::Relaxed);
        if let Some(choice) = &spec {
            self.metrics
                .record_speculation(&choice.provider, &output.stats);
        }
        if client_gone {
            self.metrics.disconnects.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let stopped_by_string = output.finish == Finish::Stopped;
        if !stopped_by_string {
            let (tail, _) = stops.push(&stream.finish()?);
            let rest = tail + &stops.finish();
            if !rest.is_empty() {
                let _ = events.blocking_send(Event::Text(rest));
            }
        }
        let finish_reason = match output.finish {
            Finish::MaxTokens => "length",
            _ => "stop",
        };
        let _ = events.blocking_send(Event::Done(Done {
            finish_reason,
            prompt_tokens: prompt.len(),
            completion_tokens: output.tokens.len(),
            provider: spec.map(|s| s.provider),
            stats: output.stats,
        }));
        Ok(())
    }
}
