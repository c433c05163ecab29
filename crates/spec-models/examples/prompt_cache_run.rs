//! The mlx-spec side of `cargo xtask gate prompt-cache`: prompt-cache files
//! written for mlx-lm and read from it.
//!
//! `prompt_cache_run REQUEST.json`: a
//! `run_protocol::prompt_cache::PromptCacheRequest`. `write` prefills the
//! prefix (`prompt_cache::prefill`, mlx-lm's `cache_prompt` schedule) and
//! saves the caches; `read` runs `prefix + suffix` from fresh caches (run 0),
//! `suffix` from the file's caches (run 1) and `suffix` from caches
//! prefilled with the prefix as for a file, without the file (run 2), each
//! with `generate_step`'s schedule (prompt but the last token in chunks of
//! 2048, the last token alone, then `max_tokens` greedy steps), reports
//! their tokens and writes their logits (`logits_{i}`: `[max_tokens,
//! vocab]` float32) to the request's `logits` file. Weights run in the
//! file's dtype, as mlx-lm runs them.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use run_protocol::greedy::{GreedyReport, TokenRun};
use run_protocol::prompt_cache::{PromptCacheAction, PromptCacheReport, PromptCacheRequest};
use spec_core::{CacheSet, Target};
use spec_formats::prompt_cache::{self, ModelIdentity};
use spec_models::{load_model, DtypePolicy, LoadOptions};
use spec_runtime::cache::KvQuantization;

const PREFILL_STEP: usize = 2048;

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Greedy run of `prompt` on `caches`: the tokens and `[steps, vocab]` logits.
fn run(
    model: &dyn Target,
    mut caches: CacheSet,
    prompt: &[u32],
    max_tokens: usize,
) -> Result<(Vec<u32>, Array)> {
    let Some((&last, body)) = prompt.split_last() else {
        bail!("empty prompt");
    };
    for chunk in body.chunks(PREFILL_STEP) {
        model
            .forward(&ids(chunk), &mut caches, &[])?
            .hidden
            .eval()?;
    }
    let mut next = last;
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..max_tokens {
        let out = model.forward(&ids(&[next]), &mut caches, &[])?;
        let logits = model.logits(&out.hidden.index((.., -1, ..)))?;
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
    let request: PromptCacheRequest = run_protocol::read_request()?;
    let (dir, spec) = (&request.model, &request.spec);
    let policy = DtypePolicy::Keep;
    let model = load_model(
        dir,
        &LoadOptions {
            dtype: policy,
            kv_quantization: spec
                .kv_cache
                .map(|kv| KvQuantization::new(kv.bits, kv.group_size, kv.start))
                .transpose()?,
            max_kv_size: spec.max_kv_size,
            ..LoadOptions::default()
        },
    )?;
    let identity = ModelIdentity::new(dir.to_string_lossy().into_owned(), dir, policy, None)?;
    let report = match &request.action {
        PromptCacheAction::Write { file } => {
            let caches = prompt_cache::prefill(&model, &spec.prefix)?;
            let meta = BTreeMap::from([("tokenizer_config".to_owned(), "{}".to_owned())]);
            prompt_cache::save_prompt_cache(file, &caches, &spec.prefix, &identity, &meta)?;
            PromptCacheReport::Written {
                tokens: spec.prefix.len(),
            }
        }
        PromptCacheAction::Read { file, logits } => {
            let loaded = prompt_cache::load_prompt_cache(file, &model, &identity)?;
            if loaded.caches.offset() != spec.prefix.len() {
                bail!(
                    "the file caches {} tokens, the prefix has {}",
                    loaded.caches.offset(),
                    spec.prefix.len()
                );
            }
            let whole = [spec.prefix.clone(), spec.suffix.clone()].concat();
            let mut runs = Vec::new();
            let mut tensors = HashMap::new();
            let split = prompt_cache::prefill(&model, &spec.prefix)?;
            for (i, (caches, prompt)) in [
                (model.make_caches(), &whole[..]),
                (loaded.caches, &spec.suffix[..]),
                (split, &spec.suffix[..]),
            ]
            .into_iter()
            .enumerate()
            {
                let (tokens, rows) = run(&model, caches, prompt, spec.max_tokens)?;
                runs.push(TokenRun { tokens });
                tensors.insert(format!("logits_{i}"), rows);
            }
            Array::save_safetensors(&tensors, None, logits)?;
            PromptCacheReport::Ran(GreedyReport { runs })
        }
    };
    run_protocol::write_report::<PromptCacheRequest>(&report)?;
    Ok(())
}
