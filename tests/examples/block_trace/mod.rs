//! What `dspark_trace` and `dflash_trace` share: for each prompt, plain
//! greedy decoding, then greedy speculative decoding with a block drafter
//! through the serve loop (a fixed draft count), recording what the
//! drafter saw and did (`run_protocol::dspark::DsparkRun`: the prompt, per
//! round the anchor, the context length, the block's tokens and confidence
//! bits, the drafts, the accepted count; both outputs with the speculation
//! stats) and the target taps it read (`r{i}.prefill`, `r{i}.v{j}`), so
//! that a Python oracle can replay the same rounds.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use anyhow::{Context, Result};
use mlx_rs::Array;
use run_protocol::dspark::{DsparkRound, DsparkRun};
use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, PrefillMode, Sampler, SpecError,
    Target,
};
use spec_models::{load_model, DtypePolicy, LoadOptions, LoadedModel};
use spec_runtime::block_source::{BlockDrafter, BlockSource};

/// A block drafter's source, as the trace reads it.
pub trait Traced: DraftSource {
    /// Rows of the drafter's context before the next block.
    fn context_rows(&self) -> usize;
    /// The last block proposed: its tokens, and its confidences' bits
    /// where the drafter has a confidence head.
    fn last_block(&self) -> Option<(Vec<u32>, Option<Vec<u32>>)>;
}

impl<D: BlockDrafter> Traced for BlockSource<D> {
    fn context_rows(&self) -> usize {
        self.context_len()
    }

    fn last_block(&self) -> Option<(Vec<u32>, Option<Vec<u32>>)> {
        self.last_proposal().map(|block| {
            let bits = block
                .confidences
                .as_ref()
                .map(|c| c.iter().map(|x| x.to_bits()).collect());
            (block.tokens.clone(), bits)
        })
    }
}

/// Opens a block drafter's source on a target (the provider's own
/// `source`, as the trace reads it).
pub type OpenBlock<'p> =
    &'p dyn for<'t> Fn(&'t dyn Target) -> Result<Box<dyn Traced + 't>, SpecError>;

/// The target, as the gates load it (float32).
pub fn load_target(dir: &Path) -> Result<LoadedModel> {
    let options = LoadOptions {
        dtype: DtypePolicy::Float32,
        ..LoadOptions::default()
    };
    Ok(load_model(dir, &options)?)
}

/// Runs every prompt plainly and with `provider` (its sources opened by
/// `open`, `num_draft` drafts a round), writes the taps to `taps` and
/// returns each request's record.
pub fn trace(
    target: &dyn Target,
    provider: &dyn DraftProvider,
    open: OpenBlock<'_>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    num_draft: usize,
    taps: &Path,
) -> Result<Vec<DsparkRun>> {
    let recorder = Recorder {
        inner: provider,
        open,
        trace: Rc::new(RefCell::new(Trace::default())),
    };
    let mut outputs = Vec::new();
    for ids in prompts {
        let providers: [&dyn DraftProvider; 1] = [&recorder];
        let run = |speculation: Option<ProviderChoice>| -> Result<serve_loop::Output> {
            let request = Request {
                speculation,
                ..Request::new(ids.clone(), max_tokens)
            };
            Ok(serve_loop::generate(target, &providers, request, |_| {
                std::ops::ControlFlow::Continue(())
            })?)
        };
        let plain = run(None)?;
        let config = SpecConfig {
            num_draft,
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
    if let Some(dir) = taps.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Array::save_safetensors(
        trace.arrays.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        taps,
    )?;
    Ok(trace
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
        .collect())
}

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
    inner: &'p dyn DraftProvider,
    open: OpenBlock<'p>,
    trace: Rc<RefCell<Trace>>,
}

struct RecordingSource<'t> {
    inner: Box<dyn Traced + 't>,
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
            inner: (self.open)(target)?,
            trace: Rc::clone(&self.trace),
            request,
        }))
    }
}

impl DraftSource for RecordingSource<'_> {
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
        let context_len = self.inner.context_rows();
        let started = std::time::Instant::now();
        let draft = self.inner.draft(request, sampler)?;
        let draft_seconds = started.elapsed().as_secs_f64();
        let (block, confidence_bits) = self
            .inner
            .last_block()
            .ok_or(SpecError::Internal("no proposal recorded"))?;
        self.trace.borrow_mut().requests[self.request]
            .rounds
            .push(DsparkRound {
                anchor,
                context_len,
                max_tokens,
                block,
                confidence_bits,
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
