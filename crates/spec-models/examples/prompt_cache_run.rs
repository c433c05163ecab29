//! The mlx-spec side of `cargo xtask gate prompt-cache`: prompt-cache files
//! written for mlx-lm and read from it.
//!
//! `prompt_cache_run --model DIR --spec SPEC.json --write FILE` prefills
//! `prefix` (`prompt_cache::prefill`, mlx-lm's `cache_prompt` schedule) and
//! saves the caches; `prompt_cache_run --model DIR --spec SPEC.json --read
//! FILE --out PREFIX` runs `prefix + suffix` from fresh caches (run 0),
//! `suffix` from the file's caches (run 1) and `suffix` from caches
//! prefilled with `prefix` as for a file, without the file (run 2), each
//! with `generate_step`'s
//! schedule (prompt but the last token in chunks of 2048, the last token
//! alone, then `max_tokens` greedy steps), and writes `PREFIX.json`
//! (`{"runs": [{"tokens": [...]}, ...]}`) and `PREFIX.safetensors`
//! (`logits_{i}`: `[max_tokens, vocab]` float32). SPEC.json:
//! `{"prefix": [ids], "suffix": [ids], "max_tokens": N}`. Weights run in
//! the file's dtype, as mlx-lm runs them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use spec_core::{CacheSet, Target};
use spec_formats::prompt_cache::{self, ModelIdentity};
use spec_models::{load_model, DtypePolicy, LoadOptions};

const PREFILL_STEP: usize = 2048;

#[derive(serde::Deserialize)]
struct Spec {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    max_tokens: usize,
}

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
    let mut flags = BTreeMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        flags.insert(flag, PathBuf::from(value));
    }
    let flag = |name: &str| {
        flags
            .get(name)
            .with_context(|| format!("{name} is required"))
    };
    let (dir, spec_path) = (flag("--model")?, flag("--spec")?);
    let spec: Spec = serde_json::from_str(
        &std::fs::read_to_string(spec_path)
            .with_context(|| format!("reading {}", spec_path.display()))?,
    )?;
    let policy = DtypePolicy::Keep;
    let model = load_model(
        dir,
        &LoadOptions {
            dtype: policy,
            ..LoadOptions::default()
        },
    )?;
    let identity = ModelIdentity::new(dir.to_string_lossy().into_owned(), dir, policy)?;
    if let Some(file) = flags.get("--write") {
        let caches = prompt_cache::prefill(&model, &spec.prefix)?;
        let meta = BTreeMap::from([("tokenizer_config".to_owned(), "{}".to_owned())]);
        prompt_cache::save_prompt_cache(file, &caches, &spec.prefix, &identity, &meta)?;
        return Ok(());
    }
    let loaded = prompt_cache::load_prompt_cache(flag("--read")?, &model, &identity)?;
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
        let (tokens, logits) = run(&model, caches, prompt, spec.max_tokens)?;
        runs.push(serde_json::json!({ "tokens": tokens }));
        tensors.insert(format!("logits_{i}"), logits);
    }
    let prefix = flag("--out")?.to_string_lossy().into_owned();
    std::fs::write(
        format!("{prefix}.json"),
        serde_json::to_string(&serde_json::json!({ "runs": runs }))?,
    )?;
    Array::save_safetensors(&tensors, None, format!("{prefix}.safetensors"))?;
    Ok(())
}
