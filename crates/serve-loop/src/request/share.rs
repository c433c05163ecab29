//! A request's side of prefill shared between requests in flight (see
//! [`crate::shared_prefill`]): what a queued request asks for, what an
//! active one can leave in the prefix cache for it, and the entries it
//! publishes after a step.

use super::{Phase, RequestState};
use crate::prefix_cache::{common_prefix, Boundaries};
use crate::reuse::Entry;

/// What a queued request could start from: its prompt, in its partition,
/// under its rule, with its source's saved state where it needs one.
pub(crate) struct Ask<'s> {
    /// Its prompt.
    pub(crate) prompt: &'s [u32],
    /// Its prefix-cache partition.
    pub(crate) partition: &'s str,
    /// Where its caches may be reused.
    pub(crate) rule: Boundaries,
    /// The key of its provider's saved states, when its source reads
    /// tapped layers (it needs one covering the prefix).
    pub(crate) state_key: Option<&'s str>,
}

/// A prefix of a queued request's prompt that an active request can leave
/// in the prefix cache: its tokens, and whether its caches hold it now or
/// will once its prefill gets there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    /// The prefix's tokens (an exact boundary of both prompts).
    pub(crate) at: usize,
    /// Whether it can be published at once.
    pub(crate) now: bool,
}

impl RequestState<'_> {
    /// What this queued request asks for: nothing unless it will look the
    /// prefix cache up.
    pub(crate) fn ask(&self) -> Option<Ask<'_>> {
        let taps = !self.round.taps().is_empty();
        self.lookup.then(|| Ask {
            prompt: &self.prompt,
            partition: &self.reuse.partition,
            rule: self.reuse.rule,
            state_key: self.reuse.state_key.as_deref().filter(|_| taps),
        })
    }

    /// The rule this request's entries were taken under.
    pub(crate) fn rule(&self) -> Boundaries {
        self.reuse.rule
    }

    /// Committed tokens the caches hold.
    fn held(&self) -> usize {
        self.caches.offset().min(self.history.len())
    }

    fn prefilling(&self) -> bool {
        matches!(self.phase, Phase::Prefill { .. } | Phase::Last)
    }

    /// The longest prefix of `ask`'s prompt this request can leave in the
    /// prefix cache for it (same partition and rule). On a split-invariant
    /// target that is every token its history shares (its caches trimmed
    /// there), held now or reached later in its prefill; otherwise a grid
    /// point (or the identical prompt body's end) its prefill has still to
    /// reach or snapshots anyway, published when its prefill ends. A
    /// source that reads tapped layers takes a prefix only with a saved
    /// state of its own provider's, which this request's source saves when
    /// its prefill ends: only a request of the same provider offers one,
    /// published from then on.
    pub(crate) fn offer(&self, ask: &Ask<'_>) -> Option<Offer> {
        let live = self.reuse.keeps() && self.error.is_none() && self.phase != Phase::Done;
        if !live || ask.partition != self.reuse.partition || ask.rule != self.reuse.rule {
            return None;
        }
        let needs_state = ask.state_key.is_some();
        if needs_state && ask.state_key != self.reuse.state_key.as_deref() {
            return None;
        }
        let body = ask.prompt.len().saturating_sub(1);
        let held = self.held();
        match self.reuse.rule {
            Boundaries::Any => {
                let at = common_prefix(&self.history, ask.prompt).min(body);
                if at == 0 {
                    None
                } else if at <= held && !(needs_state && self.prefilling()) {
                    Some(Offer { at, now: true })
                } else {
                    (self.prefilling() && at <= self.body_end()).then_some(Offer { at, now: false })
                }
            }
            Boundaries::Grid(chunk) => {
                // Once the prefill has ended its snapshots are in the cache.
                if !self.prefilling() {
                    return None;
                }
                let shared = common_prefix(&self.prompt, ask.prompt).min(body);
                let at = if shared == body && shared == self.body_end() {
                    shared
                } else {
                    shared / chunk.max(1) * chunk
                };
                (at > 0 && (at > held || self.reuse.snapshots_at(at)))
                    .then_some(Offer { at, now: false })
            }
        }
    }

    /// Publishes a prefix of `at` tokens for a request waiting on it (an
    /// [`Offer`] of this request's; `with_state`: once this request's
    /// source has saved its state): see [`crate::reuse::Reuse::share_at`].
    pub(crate) fn share_at(&mut self, at: usize, with_state: bool) {
        self.reuse.share_at(at, with_state);
    }

    /// The entries this request publishes now: copies at the points others
    /// wait for that its caches reached, and, once its prefill has ended,
    /// its prefill's snapshots. Nothing from a failed request.
    pub(crate) fn take_published(&mut self) -> Vec<Entry> {
        if self.error.is_some() {
            return Vec::new();
        }
        let held = self.held();
        let prefilled = self.phase == Phase::Decode;
        self.reuse
            .take_published(&self.caches, &self.history, held, prefilled)
    }
}
