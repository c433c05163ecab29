//! Our side of `cargo xtask gate mtp`: scripted speculative rounds with the
//! `glm52-native-mtp` source on a GLM checkpoint, recording each round's
//! drafts and the MTP cache afterwards.
//!
//! `mtp_trace REQUEST.json`: a `run_protocol::mtp::MtpRequest`. Round r of
//! the schedule, `(n, k)`, drafts n tokens greedily; the target verifies
//! `[pending, drafts]`; the first `min(k, n)` drafts count as accepted
//! whatever the target says (so partial and full acceptance happen on
//! random weights), the target's greedy token after them is the next
//! pending token; target caches and the source are rolled back and
//! committed as the serve loop does. Reports each round's drafts, accepted
//! count, next token and cache offset (`MtpReport`, on standard output) and
//! writes the request's `tensors` file (`latent_{r}`, `rope_{r}`: the MTP
//! cache rows; `index_{r}`: the MTP indexer's keys, when the row has an
//! indexer).

use std::collections::HashMap;

use anyhow::{Context, Result};
use draft_glm52_mtp::Glm52MtpProvider;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use run_protocol::mtp::{MtpReport, MtpRequest, MtpRound};
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, ProviderOptions, Target};
use spec_models::glm::Model;
use spec_models::{DtypePolicy, LoadOptions};

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
    let args: MtpRequest = run_protocol::read_request()?;
    let (model_dir, schedule) = (&args.model, &args.schedule);
    let model = Model::load(
        model_dir,
        &LoadOptions {
            dtype: DtypePolicy::Keep,
            expert_cache_bytes: args.experts.cache_bytes,
            mtp_expert_bits: args.experts.mtp_expert_bits,
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
            foreign: &[],
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
        rounds.push(MtpRound {
            offset: source.cache_offset(),
            drafts,
            k,
            next,
        });
        anchor = verified.hidden.index((.., k as i32..k as i32 + 1, ..));
        pending = next;
    }
    Array::save_safetensors(&tensors, None, &args.tensors)?;
    run_protocol::write_report::<MtpRequest>(&MtpReport { rounds })?;
    Ok(())
}
