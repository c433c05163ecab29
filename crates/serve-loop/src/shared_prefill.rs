//! Prefill shared between requests in flight. A queued request whose
//! prompt starts with tokens an active request of its prefix-cache
//! partition holds, or is prefilling, takes them from that request instead
//! of running them beside it: `n` choices of one prompt prefill it once,
//! agents sending one system prompt at once prefill it once.
//!
//! When a request is about to join a step, the longest such prefix an
//! active request offers (see [`RequestState::offer`]) is weighed against
//! what the prefix cache already holds for it. Worth it (it covers at
//! least half of what the request would prefill), the active request
//! publishes that prefix to the prefix cache: at once when its caches
//! hold it, otherwise after the step in which its prefill reaches it, and
//! the queued request waits in its place, holding a place in the batch
//! (others behind it may take the remaining ones), and
//! looks the cache up when it joins. The entries are ordinary prefix-cache
//! entries at exact boundaries, so the waiting request's output is the one
//! it gets cold; a wait lasts at most the active request's prefill (a
//! publication that fails, a request that ends or fails, ends it).

use crate::prefix_cache::PrefixCache;
use crate::request::{Offer, RequestState};
use crate::scheduler::JobId;

/// Whether `queued` may join a step now; `false`: it waits for a prefix
/// one of `active` will publish (which is told so). A prefix an active
/// request holds now is published here.
pub(crate) fn may_join(
    queued: &RequestState<'_>,
    active: &mut [(JobId, RequestState<'_>)],
    cache: &mut PrefixCache,
) -> bool {
    let Some(ask) = queued.ask() else {
        return true;
    };
    let cached = cache.longest_in(ask.partition, ask.prompt, ask.rule, ask.state_key);
    let rest = ask.prompt.len().saturating_sub(1).saturating_sub(cached);
    let best = active
        .iter()
        .enumerate()
        .filter_map(|(i, (_, s))| s.offer(&ask).map(|o| (i, o)))
        .max_by_key(|(_, o)| (o.at, o.now));
    let Some((i, Offer { at, now })) = best else {
        return true;
    };
    let gain = at.saturating_sub(cached);
    if gain == 0 || gain.saturating_mul(2) < rest {
        return true;
    }
    let leader = &mut active[i].1;
    tracing::debug!(
        at,
        cached,
        now,
        "a queued request shares an active request's prefill"
    );
    leader.share_at(at, ask.state_key.is_some());
    if now {
        publish(leader, cache);
    }
    now
}

/// Puts what `state` publishes now into `cache` (its partition).
pub(crate) fn publish(state: &mut RequestState<'_>, cache: &mut PrefixCache) {
    let rule = state.rule();
    for (tokens, caches, drafts) in state.take_published() {
        cache.insert_in(state.partition().to_owned(), tokens, caches, drafts, rule);
    }
}
