//! Plain (non-speculative) generation with mlx-lm's schedule: prefill
//! `prompt[..len-1]` in chunks, then one token at a time; logits processors,
//! log-probabilities, the request's sampler; EOS ends the request unprinted.

use std::time::Instant;

use anyhow::{bail, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{LogitsProcessor, Sampler, Target};

const PREFILL_CHUNK: usize = 2048;

/// What `generate` measured.
#[derive(Debug, Default, Clone)]
pub struct DecodeStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt processing speed, tokens per second.
    pub prompt_tps: f64,
    /// Tokens generated (EOS excluded).
    pub generated: usize,
    /// Generation speed, tokens per second.
    pub generation_tps: f64,
    /// Whether an EOS token ended the request.
    pub hit_eos: bool,
}

/// One request's generation settings.
pub struct Request<'a> {
    /// Prompt token ids (at least one).
    pub prompt: &'a [u32],
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end the request.
    pub is_eos: &'a dyn Fn(u32) -> bool,
    /// The request's sampler.
    pub sampler: &'a mut dyn Sampler,
    /// Applied to the logits before sampling.
    pub processors: &'a mut [Box<dyn LogitsProcessor>],
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Generates, calling `on_token` with each emitted token id.
pub fn generate(model: &dyn Target, req: Request<'_>, mut on_token: impl FnMut(u32) -> Result<()>) -> Result<DecodeStats> {
    let Some((&last, body)) = req.prompt.split_last() else { bail!("the prompt is empty") };
    let mut stats = DecodeStats { prompt_tokens: req.prompt.len(), ..DecodeStats::default() };
    let mut caches = model.make_caches();
    let mut history: Vec<u32> = req.prompt.to_vec();
    let start = Instant::now();
    for chunk in body.chunks(PREFILL_CHUNK) {
        model.forward(&ids(chunk), &mut caches, &[])?.hidden.eval()?;
    }
    let mut next = last;
    let mut gen_start = None;
    for step in 0..req.max_tokens {
        let out = model.forward(&ids(&[next]), &mut caches, &[])?;
        let mut logits = model.logits(&out.hidden.index((.., -1, ..)))?;
        for p in req.processors.iter_mut() {
            logits = p.process(&history, &logits)?;
        }
        let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        let token = req.sampler.sample(&logprobs, step)?;
        token.eval()?;
        if gen_start.is_none() {
            // The first token closes prompt processing, as mlx-lm counts it.
            let secs = start.elapsed().as_secs_f64();
            stats.prompt_tps = req.prompt.len() as f64 / secs.max(1e-9);
            gen_start = Some(Instant::now());
        }
        next = token.as_dtype(Dtype::Uint32)?.as_slice::<u32>()[0];
        if (req.is_eos)(next) {
            stats.hit_eos = true;
            break;
        }
        history.push(next);
        stats.generated += 1;
        on_token(next)?;
    }
    if let Some(t) = gen_start {
        stats.generation_tps = stats.generated as f64 / t.elapsed().as_secs_f64().max(1e-9);
    }
    Ok(stats)
}
