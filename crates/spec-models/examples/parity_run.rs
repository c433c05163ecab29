//! The mlx-spec side of `cargo xtask gate parity`: greedy continuations and
//! the raw logits of every step, with the schedule mlx-lm's `generate_step`
//! uses (prefill `prompt[..len-1]` in chunks of 2048, then the last prompt
//! token alone, then each generated token alone).
//!
//! `parity_run --model DIR --prompts PROMPTS.json --out PREFIX [--dtype keep|f32]`
//! writes `PREFIX.json` (`{"runs": [{"tokens": [...]}, ...]}`) and
//! `PREFIX.safetensors` (`logits_{i}`: `[max_tokens, vocab]` float32).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use spec_core::Target;
use spec_models::{load_model, DtypePolicy, LoadOptions};

const PREFILL_STEP: usize = 2048;

struct Args {
    model: PathBuf,
    prompts: PathBuf,
    out: PathBuf,
    dtype: DtypePolicy,
}

fn parse_args() -> Result<Args> {
    let (mut model, mut prompts, mut out, mut dtype) = (None, None, None, DtypePolicy::Keep);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => model = Some(PathBuf::from(value()?)),
            "--prompts" => prompts = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--dtype" => {
                dtype = match value()?.as_str() {
                    "keep" => DtypePolicy::Keep,
                    "f32" => DtypePolicy::Float32,
                    other => bail!("--dtype {other}: expected keep or f32"),
                }
            }
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(Args {
        model: model.context("--model is required")?,
        prompts: prompts.context("--prompts is required")?,
        out: out.context("--out is required")?,
        dtype,
    })
}

#[derive(serde::Deserialize)]
struct Prompts {
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Greedy run: returns the tokens and the `[steps, vocab]` logits.
fn run(model: &dyn Target, prompt: &[u32], max_tokens: usize) -> Result<(Vec<u32>, Array)> {
    if prompt.is_empty() {
        bail!("empty prompt");
    }
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
        let logits = model.logits(&out.hidden.index((.., -1, ..)))?;
        // mlx-lm samples from log-probabilities: the subtraction can make
        // two near-equal logits equal, so the argmax must see the same values.
        let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        let token = argmax_axis(&logprobs, -1, None)?;
        token.eval()?;
        next = token.as_dtype(Dtype::Uint32)?.as_slice::<u32>()[0];
        tokens.push(next);
        rows.push(logits.as_dtype(Dtype::Float32)?);
    }
    Ok((tokens, concatenate(&rows, 0)?))
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let prompts: Prompts = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", args.prompts.display()))?;
    let model = load_model(
        &args.model,
        &LoadOptions {
            dtype: args.dtype,
            ..LoadOptions::default()
        },
    )?;
    let mut runs = Vec::new();
    let mut tensors = HashMap::new();
    for (i, prompt) in prompts.prompts.iter().enumerate() {
        let (tokens, logits) = run(&model, prompt, prompts.max_tokens)?;
        runs.push(serde_json::json!({ "tokens": tokens }));
        tensors.insert(format!("logits_{i}"), logits);
    }
    let prefix = args.out.to_string_lossy().into_owned();
    std::fs::write(
        format!("{prefix}.json"),
        serde_json::to_string(&serde_json::json!({ "runs": runs }))?,
    )?;
    Array::save_safetensors(&tensors, None, format!("{prefix}.safetensors"))?;
    Ok(())
}
