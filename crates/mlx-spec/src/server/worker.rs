//! The engine thread: owns the model and the loaded providers, runs queued
//! requests one at a time, and streams their text back. A request whose
//! client went away stops within one round (its event channel is closed).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serve_loop::{AdaptiveConfig, Finish, Request, SpecConfig, Speculation, StopMatcher};
use spec_core::{DraftProvider, ProviderOptions, SpecStats};
use spec_models::LoadedModel as Model;
use spec_text::Tokenizer;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::api::Params;
use super::metrics::Metrics;
use super::provider_cache::ProviderCache;

/// Speculation a request asked for, resolved by the handler.
#[derive(Debug, Clone)]
pub struct SpecChoice {
    pub provider: String,
    /// `None`: the provider's default.
    pub num_draft: Option<usize>,
    /// Whether the adaptive controller sets each round's draft length;
    /// `false` drafts `num_draft` every round (the CLI's `--no-adaptive`).
    pub adaptive: bool,
    /// Per-request provider options: a provider is then built with them
    /// (or reused from the engine's cache of such providers).
    pub options: ProviderOptions,
}

/// A queued request.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: Params,
    pub spec: Option<SpecChoice>,
    /// The tenant of the request's API key (`None`: the server has no keys).
    pub tenant: Option<String>,
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

/// The serve loop's settings for `choice` served by `provider`.
fn spec_config(choice: &SpecChoice, provider: &dyn DraftProvider) -> SpecConfig {
    SpecConfig {
        num_draft: choice
            .num_draft
            .unwrap_or_else(|| provider.default_num_draft()),
        adaptive: if choice.adaptive {
            AdaptiveConfig::default()
        } else {
            AdaptiveConfig::off()
        },
        ..SpecConfig::default()
    }
}

/// The engine: model, tokenizer and the providers loaded at start.
pub struct Engine {
    pub model: Model,
    pub tokenizer: Arc<Tokenizer>,
    pub providers: BTreeMap<String, Box<dyn DraftProvider>>,
    /// Providers built for requests' own options.
    pub per_request: RefCell<ProviderCache>,
    pub metrics: Arc<Metrics>,
}

impl Engine {
    /// Serves jobs until every sender is gone.
    pub fn run(self, mut jobs: mpsc::Receiver<Job>) {
        while let Some(job) = jobs.blocking_recv() {
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            let events = job.events.clone();
            if let Err(e) = self.serve(job) {
                let _ = events.blocking_send(Event::Error(spec_core::error::report(e.as_ref())));
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
            tenant,
            events,
            permit,
        } = job;
        let _permit = permit;
        let owned: Rc<dyn DraftProvider>;
        let speculation = match &spec {
            None => None,
            Some(choice) => {
                let provider: &dyn DraftProvider = if choice.options.is_empty() {
                    self.providers
                        .get(&choice.provider)
                        .map(|p| p.as_ref())
                        .ok_or_else(|| anyhow::anyhow!("provider {} not loaded", choice.provider))?
                } else {
                    owned = self.per_request.borrow_mut().get_or_build(
                        &choice.provider,
                        &choice.options,
                        || {
                            serve_loop::build_provider(
                                &choice.provider,
                                &self.model,
                                &choice.options,
                            )
                        },
                    )?;
                    owned.as_ref()
                };
                Some(Speculation {
                    provider,
                    config: spec_config(choice, provider),
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
            tenant: tenant.as_deref(),
            prefix: None,
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

#[cfg(test)]
mod tests {
    use spec_core::{DraftSource, SpecError, Target};

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
        fn open<'a>(&'a self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
            Err(SpecError::Invalid("never opened".into()))
        }
    }

    fn choice(num_draft: Option<usize>, adaptive: bool) -> SpecChoice {
        SpecChoice {
            provider: "seven".into(),
            num_draft,
            adaptive,
            options: ProviderOptions::new(),
        }
    }

    #[test]
    fn adaptive_false_reaches_the_serve_loop_as_a_fixed_length() {
        let fixed = spec_config(&choice(Some(4), false), &Seven);
        assert_eq!(fixed.num_draft, 4);
        assert_eq!(fixed.adaptive, AdaptiveConfig::off());
        assert!(!fixed.adaptive.adapt_length && !fixed.adaptive.pause);

        let adaptive = spec_config(&choice(None, true), &Seven);
        assert_eq!(adaptive.num_draft, 7, "the provider's default");
        assert_eq!(adaptive.adaptive, AdaptiveConfig::default());
    }
}
