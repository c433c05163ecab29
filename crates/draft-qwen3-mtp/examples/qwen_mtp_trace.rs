//! Our side of `cargo xtask gate mtp` for hybrid Qwen checkpoints:
//! scripted speculative rounds with the `qwen3-native-mtp` source,
//! recording each round's drafts and the MTP cache afterwards.
//!
//! `qwen_mtp_trace REQUEST.json`: a `run_protocol::mtp::QwenMtpRequest`.
//! The prompt runs in one target forward (tapping the last layer, which the
//! source's prefill reads). Round r of the schedule, `(n, k)`, drafts n
//! tokens greedily; the target verifies `[pending, drafts]`; the first
//! `min(k, n)` drafts count as accepted whatever the target says, the
//! target's greedy token after them is the next pending token; target
//! caches and the source are rolled back and committed as the serve loop
//! does. Reports each round's drafts, accepted count, next token and cache
//! offset (`MtpReport`, on standard output) and writes the request's
//! `tensors` file (`keys_{r}`, `values_{r}`: the MTP cache rows after round
//! r, and `keys_prefill`, `values_prefill` after the prefill).

use std::collections::HashMap;

use anyhow::{Context, Result};
use draft_qwen3_mtp::{Qwen3MtpProvider, Qwen3MtpSource};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use run_protocol::mtp::{MtpReport, MtpRound, QwenMtpRequest};
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, ProviderOptions, Target};
use spec_models::qwen3_next::Model;
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

fn keep(
    tensors: &mut HashMap<String, Array>,
    source: &Qwen3MtpSource<'_>,
    tag: &str,
) -> Result<()> {
    let (keys, values) = source
        .cache_contents()
        .with_context(|| format!("empty MTP cache after {tag}"))?;
    tensors.insert(format!("keys_{tag}"), keys);
    tensors.insert(format!("values_{tag}"), values);
    Ok(())
}

fn main() -> Result<()> {
    let QwenMtpRequest(args) = run_protocol::read_request()?;
    if args.experts != run_protocol::ExpertOptions::default() {
        anyhow::bail!("qwen_mtp_trace: `experts` (streamed routed experts) is GLM's only");
    }
    let (model_dir, schedule) = (&args.model, &args.schedule);
    let model = Model::load(
        model_dir,
        &LoadOptions {
            dtype: DtypePolicy::Keep,
            ..LoadOptions::default()
        },
    )?;
    let provider = Qwen3MtpProvider::new(&model, &ProviderOptions::new())?;
    let mut source = provider.open_native(&model)?;
    let mut tensors = HashMap::new();

    let mut caches = model.make_caches();
    let prefill = model.forward(&ids(&schedule.prompt), &mut caches, source.tap_layers())?;
    source.prefill(&schedule.prompt, prefill.taps.as_ref())?;
    keep(&mut tensors, &source, "prefill")?;
    let mut anchor = prefill.hidden.index((.., -1.., ..));
    let mut pending = *greedy(&model, &anchor)?.last().context("no token")?;
    let mut rounds = Vec::new();
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
        let verified = model.decode(&ids(&window), &mut caches, &[])?;
        let k = k.min(drafts.len());
        let next = greedy(&model, &verified.hidden)?[k];
        if k < drafts.len() {
            caches.trim(drafts.len() - k)?;
        }
        caches.commit_to(caches.offset());
        source.commit(CommitInfo {
            drafted: drafts.len(),
            accepted: k,
            accepted_tokens: &drafts[..k],
            foreign: &[],
            next,
            verified_taps: None,
            verified_hidden: &verified.hidden,
        })?;
        keep(&mut tensors, &source, &r.to_string())?;
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
    run_protocol::write_report::<QwenMtpRequest>(&MtpReport { rounds })?;
    Ok(())
}
