//! Runs recorded request histories through one `SuffixProvider` the way the
//! serve loop drives its sources (greedy acceptance against each request's
//! recorded output) and reports every proposal, for gate `suffix` to compare
//! with ArcticInference's `SuffixDecodingCache`.
//!
//! `suffix_cache_trace REQUEST.json`: a `run_protocol::suffix::CacheRequest`
//! (the provider's settings; requests run one after another, each completing
//! before the next). Reports, per request, each draft (`pos`: output tokens
//! committed before it, `max`: most it could propose, `tokens`) and the
//! requests the global tree holds after it (`CacheReport`, on standard
//! output).

use anyhow::{Context, Result};
use draft_suffix::{SuffixConfig, SuffixProvider, SuffixSource};
use mlx_rs::Array;
use run_protocol::suffix::{CacheReport, CacheRequest, CacheRound, CacheTrace};
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, RequestOutcome, SpecError};

/// Runs one request to its end; returns its rounds.
fn run_request(
    source: &mut SuffixSource,
    prompt: &[u32],
    truth: &[u32],
    num_draft: usize,
) -> Result<Vec<CacheRound>, SpecError> {
    let hidden = Array::from_slice(&[0.0f32], &[1, 1, 1]);
    source.prefill(prompt, None)?;
    let mut history = prompt.to_vec();
    let mut feed: Vec<u32> = prompt.last().map(|&t| vec![t]).unwrap_or_default();
    let mut rounds = Vec::new();
    let mut emitted = 0;
    while emitted < truth.len() {
        // The round's verify forward emits one token past the accepted draft.
        let max = num_draft.min(truth.len() - emitted - 1);
        let request = DraftRequest {
            feed: &feed,
            max_tokens: max,
            anchor_hidden: None,
            history: &history,
            target_caches: None,
        };
        let draft = source.draft(request, &mut GreedySampler)?.tokens;
        let accepted = draft
            .iter()
            .zip(&truth[emitted..])
            .take_while(|(d, t)| d == t)
            .count();
        let next = truth[emitted + accepted];
        rounds.push(CacheRound {
            pos: emitted,
            max,
            tokens: draft.clone(),
        });
        source.commit(CommitInfo {
            drafted: draft.len(),
            accepted,
            accepted_tokens: &draft[..accepted],
            foreign: &[],
            next,
            verified_taps: None,
            verified_hidden: &hidden,
        })?;
        history.extend_from_slice(&draft[..accepted]);
        history.push(next);
        feed = match draft.last() {
            Some(&last) if accepted == draft.len() => vec![last, next],
            _ => vec![next],
        };
        emitted += accepted + 1;
    }
    source.finish(RequestOutcome::Completed);
    Ok(rounds)
}

fn main() -> Result<()> {
    let request: CacheRequest = run_protocol::read_request()?;
    let c = &request.config;
    let provider = SuffixProvider::new(SuffixConfig {
        max_depth: c.depth,
        max_tree_tokens: c.budget,
        max_spec_factor: c.factor,
        max_spec_offset: c.offset,
        min_token_prob: c.min_prob,
        ..SuffixConfig::default()
    })?;
    let mut traces = Vec::new();
    for (id, recorded) in request.requests.iter().enumerate() {
        if recorded.prompt.is_empty() || recorded.output.is_empty() {
            anyhow::bail!("request {id}: empty prompt or output");
        }
        let mut source = provider.source();
        let rounds = run_request(&mut source, &recorded.prompt, &recorded.output, c.num_draft)
            .with_context(|| format!("request {id}"))?;
        // The global tree keeps join order: match its requests to the
        // joined ones (requests 0..=id) in that order.
        let global = provider.global().read();
        let mut candidates = request.requests[..=id].iter().enumerate();
        let mut cached = Vec::new();
        for tokens in global.cached() {
            let (joined, _) = candidates
                .by_ref()
                .find(|(_, r)| r.output.as_slice() == tokens)
                .with_context(|| format!("request {id}: a cached request that never joined"))?;
            cached.push(joined);
        }
        traces.push(CacheTrace { rounds, cached });
    }
    run_protocol::write_report::<CacheRequest>(&CacheReport { requests: traces })?;
    Ok(())
}
