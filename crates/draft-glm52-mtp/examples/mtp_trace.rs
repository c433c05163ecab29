//! Our side of `cargo xtask gate mtp`: scripted speculative rounds with the
//! `glm52-native-mtp` source on a GLM checkpoint, recording each round's
//! drafts and the MTP cache afterwards.
//!
//! `mtp_trace --model DIR --schedule FILE.json --out PREFIX`
//!
//! FILE.json: `{"prompt": [ids], "rounds": [[n, k], ...]}`. Round r drafts
//! n tokens greedily; the target verifies `[pending, drafts]`; the first
//! `min(k, n)` drafts count as accepted whatever the target says (so partial
//! and full acceptance happen on random weights), the target's greedy token
//! after them is the next pending token; target caches and the source are
//! rolled back and committed as the serve loop does. Writes `PREFIX.json`
//! (`{"rounds": [{"drafts", "k", "next", "offset"}]}`) and
//! `PREFIX.safetensors` (`latent_{r}`, `rope_{r}`: the MTP cache rows;
//! `index_{r}`: the MTP indexer's keys, when the row has an indexer).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use draft_glm52_mtp::Glm52MtpProvider;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, ProviderOptions, Target};
use spec_models::glm::Model;
use spec_models::{DtypePolicy, LoadOptions};

#[derive(serde::Deserialize)]
struct Schedule {
    prompt: Vec<u32>,
    rounds: Vec<(usize, usize)>,
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Greedy tokens at every position of `hidden`, from log-probabilities as
/// the serve loop samples them.
fn greedy(model: &Model, hidden: &Array) -> Result<Vec<u32>> {
    let logits = model.logits(hidden)?;
    let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
    let t = argmax_axis(&logprobs, -1, None)?
        .as_dtype(Dtype::Uint32)?
        .flatten(None, None)?;
    t.eval()?;
    Ok(t.as_slice::<u32>().to_vec())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut model_dir, mut schedule, mut out) = (None, None, None);
    while let Some(a) = args.next() {
        let v = args.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--model" => model_dir = Some(PathBuf::from(v)),
            "--schedule" => schedule = Some(PathBuf::from(v)),
            "--out" => out = Some(v),
            other => bail!("unknown argument {other}"),
        }
    }
    let (model_dir, schedule, out) = (
        model_dir.context("--model")?,
        schedule.context("--schedule")?,
        out.context("--out")?,
    );
    let schedule: Schedule = serde_json::from_str(&std::fs::read_to_string(&schedule)?)?;
    let model = Model::load(
        &model_dir,
        &LoadOptions {
            dtype: DtypePolicy::Keep,
            ..LoadOptions::default()
        },
    )?;
    let provider = Glm52MtpProvider::new(&model, &ProviderOptions::new())?;
    let mut source = provider.open_native(&model)?;
    source.prefill(&schedule.prompt, None)?;

    let mut caches = model.make_caches();
    let prefill = model.forward(&ids(&schedule.prompt), &mut caches, &[])?;
    let mut anchor = prefill.hidden.index((.., -1.., ..));
    let mut pending = *greedy(&model, &anchor)?.last().context("no token")?;
    let mut rounds = Vec::new();
    let mut tensors = HashMap::new();
    for (r, &(n, k)) in schedule.rounds.iter().enumerate() {
        let feed = [pending];
        let request = DraftRequest {
            feed: &feed,
            max_tokens: n,
            anchor_hidden: Some(&anchor),
            history: &schedule.prompt,
            target_caches: None,
        };
        let drafts = source.draft(request, &mut GreedySampler)?.tokens;
        let mut window = vec![pending];
        window.extend_from_slice(&drafts);
        let verified = model.forward(&ids(&window), &mut caches, &[])?;
        let k = k.min(drafts.len());
        let next = greedy(&model, &verified.hidden)?[k];
        if k < drafts.len() {
            caches.trim(drafts.len() - k)?;
        }
        source.commit(CommitInfo {
            drafted: drafts.len(),
            accepted: k,
            accepted_tokens: &drafts[..k],
            next,
            verified_taps: None,
            verified_hidden: &verified.hidden,
        })?;
        let (latent, rope) = source
            .cache_contents()
            .context("empty MTP cache after a round")?;
        tensors.insert(format!("latent_{r}"), latent);
        tensors.insert(format!("rope_{r}"), rope);
        if let Some(keys) = source.indexer_keys() {
            tensors.insert(format!("index_{r}"), keys);
        }
        rounds.push(serde_json::json!({"drafts": drafts, "k": k, "next": next, "offset": source.cache_offset()}));
        anchor = verified.hidden.index((.., k as i32..k as i32 + 1, ..));
        pending = next;
    }
    std::fs::write(
        format!("{out}.json"),
        serde_json::to_string(&serde_json::json!({ "rounds": rounds }))?,
    )?;
    Array::save_safetensors(&tensors, None, format!("{out}.safetensors"))?;
    Ok(())
}
