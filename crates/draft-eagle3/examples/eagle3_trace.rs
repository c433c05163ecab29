//! Our side of `cargo xtask gate eagle3`: scripted speculative rounds with
//! the `eagle3` source on a llama target, recording each round's drafts,
//! the target's taps the head read, and the head's draft logits.
//!
//! `eagle3_trace REQUEST.json`: a `run_protocol::eagle3::Eagle3Request`.
//! The prompt runs in one target forward, tapping the head's layers. Round
//! r of the schedule, `(n, k)`, drafts n tokens greedily; the target
//! verifies `[pending, drafts]` (tapping again); the first `min(k, n)`
//! drafts count as accepted whatever the target says, the target's greedy
//! token after them is the next pending token; target caches and the
//! source are rolled back and committed as the serve loop does.

use std::collections::HashMap;

use anyhow::{Context, Result};
use draft_eagle3::{Eagle3Provider, Options};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use run_protocol::eagle3::Eagle3Request;
use run_protocol::mtp::{MtpReport, MtpRound};
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, Target};
use spec_models::llama::Model;
use spec_models::{DtypePolicy, LoadOptions};

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

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
    let args: Eagle3Request = run_protocol::read_request()?;
    let keep = LoadOptions {
        dtype: DtypePolicy::Keep,
        ..LoadOptions::default()
    };
    let model = Model::load(&args.target, &keep)?;
    let provider = Eagle3Provider::new(
        &model,
        &Options {
            model: args.head.clone(),
            dtype: DtypePolicy::Keep,
        },
    )?;
    let mut source = provider.open_native(&model)?;
    let taps = source.tap_layers().to_vec();
    let schedule = &args.schedule;
    let mut tensors = HashMap::new();

    let mut caches = model.make_caches();
    let prefill = model.forward(&ids(&schedule.prompt), &mut caches, &taps)?;
    let prompt_taps = prefill.taps.context("the target returned no taps")?;
    source.prefill(&schedule.prompt, Some(&prompt_taps))?;
    tensors.insert("taps_prefill".to_owned(), prompt_taps);
    let mut pending = *greedy(&model, &prefill.hidden.index((.., -1.., ..)))?
        .last()
        .context("no token")?;
    tensors.insert(
        "pending".to_owned(),
        Array::from_slice(&[pending as i32], &[1]),
    );
    let mut rounds = Vec::new();
    for (r, &(n, k)) in schedule.rounds.iter().enumerate() {
        let feed = [pending];
        let request = DraftRequest {
            feed: &feed,
            max_tokens: n,
            anchor_hidden: None,
            history: &schedule.prompt,
            target_caches: None,
        };
        let drafts = source.draft(request, &mut GreedySampler)?.tokens;
        let logits = source
            .last_draft_logits()
            .context("no draft logits")?
            .clone();
        let mut window = vec![pending];
        window.extend_from_slice(&drafts);
        let verified = model.decode(&ids(&window), &mut caches, &taps)?;
        let k = k.min(drafts.len());
        let next = greedy(&model, &verified.hidden)?[k];
        if k < drafts.len() {
            caches.trim(drafts.len() - k)?;
        }
        let window_taps = verified.taps.context("the target returned no taps")?;
        source.commit(CommitInfo {
            drafted: drafts.len(),
            accepted: k,
            accepted_tokens: &drafts[..k],
            foreign: &[],
            next,
            verified_taps: Some(&window_taps),
            verified_hidden: &verified.hidden,
        })?;
        tensors.insert(format!("taps_{r}"), window_taps);
        tensors.insert(format!("logits_{r}"), logits);
        rounds.push(MtpRound {
            offset: source.cache_offset(),
            drafts,
            k,
            next,
        });
        pending = next;
    }
    Array::save_safetensors(&tensors, None, &args.tensors)?;
    run_protocol::write_report::<Eagle3Request>(&MtpReport { rounds })?;
    Ok(())
}
