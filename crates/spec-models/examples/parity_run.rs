//! The mlx-spec side of `cargo xtask gate parity`: greedy continuations and
//! the raw logits of every step, with the schedule mlx-lm's `generate_step`
//! uses (prefill `prompt[..len-1]` in chunks of 2048, then the last prompt
//! token alone, then each generated token alone), the keys and values
//! quantized where the request says (`kv_cache`). With `decoding`, spec-core's
//! logits processors run before each choice (over the prompt and the tokens
//! so far, as `generate_step` gives them) and the sampler's distribution of
//! each step is written as `probs_{i}`.
//!
//! `parity_run REQUEST.json`: a `run_protocol::greedy::ParityRequest`;
//! writes the runs' tokens (`GreedyReport`) to standard output and their
//! logits to the request's `logits` file.

use std::collections::HashMap;

use anyhow::{bail, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use run_protocol::greedy::{Decoding, GreedyReport, ParityRequest, TokenRun};
use spec_core::{LogitBias, LogitsProcessor, Penalties, Sampler, SamplerConfig, Target};
use spec_models::{load_model, DtypePolicy, LoadOptions};
use spec_runtime::cache::KvQuantization;

const PREFILL_STEP: usize = 2048;

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// The processors and the sampler a `Decoding` names.
struct Decoders {
    processors: Vec<Box<dyn LogitsProcessor + Send>>,
    sampler: Box<dyn Sampler>,
}

impl Decoders {
    fn new(d: &Decoding, vocab: usize) -> Result<Self> {
        let penalties = Penalties {
            repetition: d.repetition,
            presence: d.presence,
            frequency: d.frequency,
        };
        let bias = LogitBias::new(&d.logit_bias, vocab)?;
        let sampler = SamplerConfig {
            temperature: d.temperature,
            top_p: d.top_p,
            min_p: d.min_p,
            min_tokens_to_keep: d.min_tokens_to_keep,
            top_k: d.top_k,
            xtc_probability: d.xtc_probability,
            xtc_threshold: d.xtc_threshold,
            xtc_special_tokens: d.xtc_special_tokens.clone(),
            seed: 0,
        };
        if sampler.temperature <= 0.0 {
            bail!("decoding: the sampler's temperature must be above 0");
        }
        Ok(Self {
            processors: penalties.processors(Some(bias))?,
            sampler: sampler.build(vocab)?,
        })
    }
}

/// A greedy run's tokens, the `[steps, vocab]` logits and, with decoders,
/// the sampler's `[steps, vocab]` distributions.
type Run = (Vec<u32>, Array, Option<Array>);

/// Greedy run: returns the tokens and the `[steps, vocab]` logits.
fn run(
    model: &dyn Target,
    prompt: &[u32],
    max_tokens: usize,
    mut decoders: Option<Decoders>,
) -> Result<Run> {
    if prompt.is_empty() {
        bail!("empty prompt");
    }
    let mut history = prompt.to_vec();
    let mut distributions = Vec::new();
    let mut caches = model.make_caches();
    let (body, last) = prompt.split_at(prompt.len() - 1);
    for chunk in body.chunks(PREFILL_STEP) {
        let out = model.forward(&ids(chunk), &mut caches, &[])?;
        out.hidden.eval()?;
    }
    let mut next = last[0];
    let mut tokens = Vec::with_capacity(max_tokens);
    let mut rows = Vec::with_capacity(max_tokens);
    for _ in 0..max_tokens {
        let out = model.forward(&ids(&[next]), &mut caches, &[])?;
        let mut logits = model.logits(&out.hidden.index((.., -1, ..)))?;
        if let Some(d) = decoders.as_mut() {
            for p in d.processors.iter_mut() {
                logits = p.process(&history, &logits)?;
            }
        }
        // mlx-lm samples from log-probabilities: the subtraction can make
        // two near-equal logits equal, so the argmax must see the same values.
        let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        if let Some(d) = &decoders {
            distributions.push(d.sampler.probabilities(&logprobs)?);
        }
        let token = argmax_axis(&logprobs, -1, None)?;
        token.eval()?;
        next = token.as_dtype(Dtype::Uint32)?.as_slice::<u32>()[0];
        tokens.push(next);
        history.push(next);
        rows.push(logits.as_dtype(Dtype::Float32)?);
    }
    let distributions = match decoders {
        Some(_) => Some(concatenate(&distributions, 0)?),
        None => None,
    };
    Ok((tokens, concatenate(&rows, 0)?, distributions))
}

fn main() -> Result<()> {
    let args: ParityRequest = run_protocol::read_request()?;
    let model = load_model(
        &args.model,
        &LoadOptions {
            dtype: match args.dtype {
                run_protocol::Dtype::F32 => DtypePolicy::Float32,
                run_protocol::Dtype::Keep => DtypePolicy::Keep,
            },
            kv_quantization: args
                .kv_cache
                .map(|kv| KvQuantization::new(kv.bits, kv.group_size, kv.start))
                .transpose()?,
            adapter: args.adapter.clone(),
            max_kv_size: args.max_kv_size,
            ..LoadOptions::default()
        },
    )?;
    let mut runs = Vec::new();
    let mut tensors = HashMap::new();
    for (i, prompt) in args.prompts.iter().enumerate() {
        let decoders = args
            .decoding
            .as_ref()
            .map(|d| Decoders::new(d, model.info().vocab_size))
            .transpose()?;
        let (tokens, logits, probs) = run(&model, prompt, args.max_tokens, decoders)?;
        runs.push(TokenRun { tokens });
        tensors.insert(format!("logits_{i}"), logits);
        if let Some(probs) = probs {
            tensors.insert(format!("probs_{i}"), probs);
        }
    }
    Array::save_safetensors(&tensors, None, &args.logits)?;
    run_protocol::write_report::<ParityRequest>(&GreedyReport { runs })?;
    Ok(())
}
