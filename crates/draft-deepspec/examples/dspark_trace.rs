//! Our side of the DSpark gate and benchmark (`cargo xtask gate dspark`,
//! `cargo xtask bench dspark`): for each prompt, plain greedy decoding, then
//! greedy speculative decoding with the `deepspec` provider through the
//! serve loop (fixed draft count), recording everything the drafter saw and
//! did, so that `xtask/python/oracle_dspark.py` can replay the same rounds
//! independently, and both outputs with the speculation stats.
//!
//! `dspark_trace REQUEST.json`: a `run_protocol::dspark::DsparkRequest`.
//! Reports a `DsparkTrace` (per request: prompt, per round the anchor, the
//! context length, the whole block's tokens and confidence bits, the drafts
//! kept, the accepted count; the speculative and plain tokens, the stats) on
//! standard output and writes the taps to the request's `taps` file (the
//! prefill taps `r{i}.prefill` and each round's verify-window taps
//! `r{i}.v{j}`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use anyhow::{Context, Result};
use draft_deepspec::{DSparkProvider, DSparkSource, Options};
use mlx_rs::Array;
use run_protocol::dspark::{DsparkRequest, DsparkRound, DsparkRun, DsparkTrace};
use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, PrefillMode, ProviderOptions,
    Sampler, SpecError, Target,
};
use spec_models::{load_model, DtypePolicy, LoadOptions};

/// What the drafter saw of one request.
#[derive(Default)]
struct Seen {
    prompt: Vec<u32>,
    prefill_rows: usize,
    rounds: Vec<DsparkRound>,
}

#[derive(Default)]
struct Trace {
    requests: Vec<Seen>,
    arrays: HashMap<String, Array>,
}

struct Recorder<'p> {
    inner: &'p DSparkProvider,
    trace: Rc<RefCell<Trace>>,
}

struct RecordingSource {
    inner: DSparkSource,
    trace: Rc<RefCell<Trace>>,
    request: usize,
}

impl DraftProvider for Recorder<'_> {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn default_num_draft(&self) -> usize {
        self.inner.default_num_draft()
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        let request = self.trace.borrow().requests.len();
        self.trace.borrow_mut().requests.push(Seen::default());
        Ok(Box::new(RecordingSource {
            inner: self.inner.source(target)?,
            trace: Rc::clone(&self.trace),
            request,
        }))
    }
}

impl DraftSource for RecordingSource {
    fn prefill_mode(&self) -> PrefillMode {
        self.inner.prefill_mode()
    }
    fn tap_layers(&self) -> &[usize] {
        self.inner.tap_layers()
    }
    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        let mut t = self.trace.borrow_mut();
        if let Some(taps) = taps {
            t.arrays
                .insert(format!("r{}.prefill", self.request), taps.clone());
        }
        let seen = &mut t.requests[self.request];
        seen.prompt = prompt.to_vec();
        seen.prefill_rows = taps.map_or(0, |a| a.shape()[1] as usize);
        drop(t);
        self.inner.prefill(prompt, taps)
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let anchor = request.feed.last().copied();
        let max_tokens = request.max_tokens;
        let context_len = self.inner.context_len();
        let started = std::time::Instant::now();
        let draft = self.inner.draft(request, sampler)?;
        let draft_seconds = started.elapsed().as_secs_f64();
        let block = self
            .inner
            .last_proposal()
            .ok_or(SpecError::Internal("no proposal recorded"))?;
        self.trace.borrow_mut().requests[self.request]
            .rounds
            .push(DsparkRound {
                anchor,
                context_len,
                max_tokens,
                block: block.tokens.clone(),
                confidence_bits: block
                    .confidences
                    .as_ref()
                    .map(|c| c.iter().map(|x| x.to_bits()).collect()),
                drafts: draft.tokens.clone(),
                accepted: 0,
                draft_seconds,
            });
        Ok(draft)
    }
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let mut t = self.trace.borrow_mut();
        let round = t.requests[self.request].rounds.len().saturating_sub(1);
        if let Some(taps) = info.verified_taps {
            t.arrays
                .insert(format!("r{}.v{round}", self.request), taps.clone());
        }
        if let Some(r) = t.requests[self.request].rounds.last_mut() {
            r.accepted = info.accepted;
        }
        drop(t);
        self.inner.commit(info)
    }
}

fn main() -> Result<()> {
    let args: DsparkRequest = run_protocol::read_request()?;
    let target = load_model(
        &args.target,
        &LoadOptions {
            dtype: DtypePolicy::Float32,
            ..LoadOptions::default()
        },
    )?;
    let options = ProviderOptions::from([
        ("model", args.drafter.display().to_string()),
        ("threshold", args.threshold.to_string()),
        ("dtype", args.drafter_dtype.as_str().to_owned()),
    ]);
    let provider = DSparkProvider::new(&target, &Options::parse(&options)?)?;
    let recorder = Recorder {
        inner: &provider,
        trace: Rc::new(RefCell::new(Trace::default())),
    };
    let mut outputs = Vec::new();
    for ids in &args.prompts {
        let providers: [&dyn DraftProvider; 1] = [&recorder];
        let run = |speculation: Option<ProviderChoice>| -> Result<serve_loop::Output> {
            let request = Request {
                speculation,
                ..Request::new(ids.clone(), args.max_tokens)
            };
            Ok(serve_loop::generate(&target, &providers, request, |_| {
                std::ops::ControlFlow::Continue(())
            })?)
        };
        let plain = run(None)?;
        let config = SpecConfig {
            num_draft: args.num_draft,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        };
        let spec = run(Some(ProviderChoice::new(recorder.id(), config)))?;
        outputs.push((spec, plain));
    }
    let trace = recorder.trace.take();
    if trace.requests.len() != outputs.len() {
        anyhow::bail!(
            "the provider opened {} sources for {} prompts",
            trace.requests.len(),
            outputs.len()
        );
    }
    let requests = trace
        .requests
        .into_iter()
        .zip(outputs)
        .map(|(seen, (spec, plain))| DsparkRun {
            prompt: seen.prompt,
            prefill_rows: seen.prefill_rows,
            rounds: seen.rounds,
            tokens: spec.tokens,
            plain_tokens: plain.tokens,
            drafted: spec.stats.drafted,
            accepted: spec.stats.accepted,
            target_calls: spec.stats.target_calls,
            generation_seconds: spec.generation_seconds,
            plain_seconds: plain.generation_seconds,
        })
        .collect();
    if let Some(dir) = args.taps.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Array::save_safetensors(
        trace.arrays.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        &args.taps,
    )?;
    run_protocol::write_report::<DsparkRequest>(&DsparkTrace { requests })?;
    Ok(())
}
