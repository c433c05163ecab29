//! Our side of the DSpark gate and benchmark (`cargo xtask gate dspark`,
//! `cargo xtask bench dspark`): for each prompt, plain greedy decoding, then
//! greedy speculative decoding with the `deepspec` provider through the
//! serve loop (fixed draft count), recording everything the drafter saw and
//! did, so that `xtask/python/oracle_dspark.py` can replay the same rounds
//! independently, and both outputs with the speculation stats.
//!
//! ```text
//! dspark_trace --target DIR --drafter DIR --prompts FILE --out DIR
//!              [--threshold T] [--num-draft N] [--max-tokens N] [--dtype f32|keep]
//! ```
//! Writes `DIR/trace.json` (per request: prompt, per round the anchor, the
//! context length, the whole block's tokens and confidence bits, the drafts
//! kept, the accepted count; the speculative and plain tokens, the stats) and `DIR/taps.safetensors` (the prefill taps
//! `r{i}.prefill` and each round's verify-window taps `r{i}.v{j}`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use draft_deepspec::{DSparkProvider, DSparkSource, Options};
use mlx_rs::Array;
use serde_json::{json, Value};
use serve_loop::{AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, PrefillMode, Sampler, SpecError,
    Target,
};
use spec_models::{load_model, DtypePolicy, LoadOptions};

#[derive(Default)]
struct Trace {
    requests: Vec<Value>,
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
    rounds: Vec<Value>,
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
        self.trace.borrow_mut().requests.push(Value::Null);
        Ok(Box::new(RecordingSource {
            inner: self.inner.source(target)?,
            trace: Rc::clone(&self.trace),
            request,
            rounds: Vec::new(),
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
        t.requests[self.request] =
            json!({ "prompt": prompt, "prefill_rows": taps.map_or(0, |a| a.shape()[1]) });
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
        let ctx = self.inner.context_len();
        let draft = self.inner.draft(request, sampler)?;
        let block = self
            .inner
            .last_proposal()
            .ok_or(SpecError::Internal("no proposal recorded"))?;
        self.rounds.push(json!({
            "anchor": anchor,
            "context_len": ctx,
            "max_tokens": max_tokens,
            "block": block.tokens,
            "confidence_bits": block.confidences.as_ref().map(|c| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
            "drafts": draft.tokens,
        }));
        Ok(draft)
    }
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let round = self.rounds.len().saturating_sub(1);
        if let Some(taps) = info.verified_taps {
            self.trace
                .borrow_mut()
                .arrays
                .insert(format!("r{}.v{round}", self.request), taps.clone());
        }
        if let Some(r) = self.rounds.last_mut() {
            r["accepted"] = json!(info.accepted);
        }
        self.inner.commit(info)?;
        let mut t = self.trace.borrow_mut();
        t.requests[self.request]["rounds"] = json!(self.rounds);
        Ok(())
    }
}

struct Args {
    target: PathBuf,
    options: spec_core::ProviderOptions,
    prompts: PathBuf,
    out: PathBuf,
    num_draft: usize,
    max_tokens: usize,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        target: PathBuf::new(),
        options: Default::default(),
        prompts: PathBuf::new(),
        out: PathBuf::new(),
        num_draft: 4,
        max_tokens: 24,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--target" => a.target = value()?.into(),
            "--drafter" => drop(a.options.insert("model".into(), value()?)),
            "--threshold" => drop(a.options.insert("threshold".into(), value()?)),
            "--dtype" => drop(a.options.insert("dtype".into(), value()?)),
            "--prompts" => a.prompts = value()?.into(),
            "--out" => a.out = value()?.into(),
            "--num-draft" => a.num_draft = value()?.parse()?,
            "--max-tokens" => a.max_tokens = value()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    if a.target.as_os_str().is_empty()
        || a.prompts.as_os_str().is_empty()
        || a.out.as_os_str().is_empty()
        || !a.options.contains_key("model")
    {
        bail!("--target, --drafter, --prompts and --out are required");
    }
    Ok(a)
}

fn main() -> Result<()> {
    let args = parse()?;
    let target = load_model(
        &args.target,
        &LoadOptions {
            dtype: DtypePolicy::Float32,
            ..LoadOptions::default()
        },
    )?;
    let provider = DSparkProvider::new(&target, &Options::parse(&args.options)?)?;
    let recorder = Recorder {
        inner: &provider,
        trace: Rc::new(RefCell::new(Trace::default())),
    };
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let prompts: Value = serde_json::from_str(&text)?;
    let prompts = prompts["prompts"]
        .as_array()
        .context("prompts file without a `prompts` list")?;
    let mut outputs = Vec::new();
    for p in prompts {
        let ids: Vec<u32> =
            serde_json::from_value(p["ids"].clone()).context("prompt without `ids`")?;
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
        let s = &spec.stats;
        outputs.push(json!({
            "tokens": spec.tokens,
            "plain_tokens": plain.tokens,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "target_calls": s.target_calls,
            "generation_seconds": spec.generation_seconds,
            "plain_seconds": plain.generation_seconds,
        }));
    }
    let trace = recorder.trace.take();
    std::fs::create_dir_all(&args.out)?;
    let requests: Vec<Value> = trace
        .requests
        .into_iter()
        .zip(outputs)
        .map(|(mut r, out)| {
            if let (Some(r), Some(out)) = (r.as_object_mut(), out.as_object()) {
                r.extend(out.clone());
            }
            r
        })
        .collect();
    std::fs::write(
        args.out.join("trace.json"),
        serde_json::to_string_pretty(&json!({ "requests": requests }))?,
    )?;
    Array::save_safetensors(
        trace.arrays.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        args.out.join("taps.safetensors"),
    )?;
    Ok(())
}
