//! A request's rounds: the draft source (and the one retired when the
//! caches stopped allowing rollback), the draft length, the current round's
//! drafts from `plan` to `absorb`, verification of its window position by
//! position, and what the next round feeds.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{
    CacheSet, CommitInfo, Draft, DraftRequest, DraftSource, LogitsProcessor, RequestOutcome,
    Sampler, SpecError, SpecStats,
};

use super::constrained::{Constrained, MAX_FORCED};
use super::{chosen_logprob, host_probs, logprobs, token_of, top_logprobs};
use crate::goodput::{DraftPolicy, RowProfile};
use crate::verify::{judge, sample, Verdict};
use crate::{DraftController, ServeError, SpecConfig};

/// A round's drafts, kept from `plan` to `absorb`.
pub(super) struct Drafted {
    /// What the source proposed.
    draft: Draft,
    /// The draft length the source was asked for (0: it was not asked,
    /// and hears nothing of the round).
    n: usize,
    /// The window's drafts: the source's first `kept` (those the
    /// constraint allows), then the tokens the constraint forced.
    window: Vec<u32>,
    kept: usize,
}

/// What verification of a window found.
pub(super) struct Walked {
    /// Drafts accepted.
    pub(super) accepted: usize,
    /// The token after them (the target's).
    pub(super) next: u32,
    /// Log-probabilities of the accepted drafts and `next`.
    pub(super) logprobs: Vec<f32>,
    /// The most likely tokens at each of those positions.
    pub(super) top: Vec<Vec<(u32, f32)>>,
    /// Whether the request's constraint is complete after the accepted
    /// drafts: `next` is then no token (nothing but the end may follow).
    pub(super) complete: bool,
}

/// A request's drafting and verification state.
pub(super) struct Round<'a> {
    /// The provider's id (for errors and logs).
    pub(super) provider: Option<String>,
    pub(super) source: Option<Box<dyn DraftSource + 'a>>,
    /// The source, once the caches could no longer roll back a draft: told
    /// how the request ends, never asked to draft again.
    retired: Option<Box<dyn DraftSource + 'a>>,
    controller: DraftController,
    /// Whether the goodput policy may cut this request's lengths: only
    /// under exact-match verification, where a window's length cannot
    /// change the tokens (rejection sampling's seeded draws follow the
    /// window's shape, so its lengths stay the controller's, which depend
    /// on the request alone).
    goodput: bool,
    /// The length the goodput policy gave the next round (at most the
    /// controller's); taken by `draft`.
    limit: Option<usize>,
    /// The next round's draft, made at its full length before the policy
    /// chose its length (a cheap source's; see `profile`); taken by `draft`.
    /// With the length it was asked for.
    ahead: Option<(usize, Result<Draft, ServeError>)>,
    /// Leviathan rejection sampling instead of exact match.
    rejection: bool,
    rng: StdRng,
    /// The token the next window starts with (sampled, not yet forwarded).
    pub(super) pending: u32,
    /// What the source is fed next round.
    pub(super) feed: Vec<u32>,
    /// The hidden state the next draft is anchored on.
    pub(super) anchor: Option<Array>,
    drafted: Option<Drafted>,
    /// The request's constraint.
    pub(super) constraint: Option<Constrained>,
    /// How many most likely tokens to report per emitted token.
    top_logprobs: usize,
}

impl<'a> Round<'a> {
    /// Rounds with `source` (opened for `provider`), `pending` the prompt's
    /// last token.
    pub(super) fn new(
        source: Option<Box<dyn DraftSource + 'a>>,
        provider: Option<String>,
        config: &SpecConfig,
        rejection: bool,
        pending: u32,
        constraint: Option<Constrained>,
        top_logprobs: usize,
    ) -> Self {
        Self {
            provider,
            source,
            retired: None,
            controller: DraftController::new(config.num_draft, config.adaptive.clone()),
            goodput: config.adaptive.adapt_length
                && config.adaptive.policy == DraftPolicy::Goodput
                && !rejection,
            limit: None,
            ahead: None,
            rejection,
            rng: StdRng::seed_from_u64(config.seed),
            pending,
            feed: vec![pending],
            anchor: None,
            drafted: None,
            constraint,
            top_logprobs,
        }
    }

    /// A source's error, naming its provider.
    pub(super) fn named(&self, e: SpecError) -> ServeError {
        ServeError::source(self.provider.as_deref().unwrap_or("?"), e)
    }

    /// Whether the request decodes without a source (never had one, or
    /// none retired).
    pub(super) fn is_plain(&self) -> bool {
        self.source.is_none() && self.retired.is_none()
    }

    /// The decoder layers the source taps (none when plain).
    pub(super) fn taps(&self) -> &[usize] {
        self.source.as_ref().map_or(&[], |s| s.tap_layers())
    }

    /// Whether the request has no constraint and reports no top
    /// log-probabilities.
    pub(super) fn is_unconstrained(&self) -> bool {
        self.constraint.is_none() && self.top_logprobs == 0
    }

    /// How many most likely tokens to report per emitted token.
    pub(super) fn top_logprobs(&self) -> usize {
        self.top_logprobs
    }

    /// Whether the controller paused drafting.
    pub(super) fn paused(&self) -> bool {
        self.controller.paused()
    }

    /// Decoding goes on from `token`, the pending one.
    pub(super) fn resume_from(&mut self, token: u32) {
        self.pending = token;
        self.feed = vec![token];
    }

    /// Forgets the current round's drafts (the request ended).
    pub(super) fn clear(&mut self) {
        self.drafted = None;
        self.limit = None;
        self.ahead = None;
        if let Some(c) = self.constraint.as_mut() {
            c.clear();
        }
    }

    /// Drafts this round (with at most `remaining` tokens to emit) and
    /// returns its verify window, `[pending, drafts..]`. Near a sliding
    /// window's end it drafts only as far as `caches` can still roll back;
    /// once nothing can be rolled back the source retires and decoding
    /// goes on plainly.
    pub(super) fn draft(
        &mut self,
        remaining: usize,
        history: &[u32],
        caches: &CacheSet,
        sampler: &mut dyn Sampler,
        stats: &mut SpecStats,
    ) -> Result<Vec<u32>, ServeError> {
        let wanted = self.wanted_len(remaining);
        let mut n = Self::rollback_len(wanted, caches);
        if wanted > 0 && n == 0 {
            stats.untrimmable_fallback = true;
            self.retired = self.source.take();
        }
        if let Some(limit) = self.limit.take() {
            // A source that does not catch up from the history must see
            // every round (a skipped one leaves DeepSpec's context or an MTP
            // cache a row short): it drafts at least one token while its
            // controller drafts at all.
            let floor = usize::from(
                n > 0
                    && self
                        .source
                        .as_ref()
                        .is_some_and(|s| !s.syncs_from_history()),
            );
            n = n.min(limit.max(floor));
        }
        // A draft made ahead is cut to `n` here: the source hears of the
        // cut drafts as rejected.
        let (asked, draft) = match self.ahead.take() {
            Some((asked, ahead)) => (asked, ahead?),
            None => (n, self.ask(n, history, caches, sampler)?),
        };
        let usable = draft.tokens.len().min(n);
        stats.cut_drafts += draft.tokens.len() - usable;
        let (window, kept) = self.constrain(&draft.tokens[..usable], remaining, caches, stats)?;
        let mut tokens = Vec::with_capacity(window.len() + 1);
        tokens.push(self.pending);
        tokens.extend_from_slice(&window);
        self.drafted = Some(Drafted {
            draft,
            n: asked,
            window,
            kept,
        });
        Ok(tokens)
    }

    /// The source's draft of at most `n` tokens (none without a source or
    /// when `n` is 0).
    fn ask(
        &mut self,
        n: usize,
        history: &[u32],
        caches: &CacheSet,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, ServeError> {
        let draft = match self.source.as_mut() {
            Some(src) if n > 0 => src
                .draft(
                    DraftRequest {
                        feed: &self.feed,
                        max_tokens: n,
                        anchor_hidden: self.anchor.as_ref(),
                        history,
                        target_caches: Some(caches),
                    },
                    sampler,
                )
                .map_err(|e| self.named(e))?,
            _ => Draft::default(),
        };
        let d = draft.tokens.len();
        if d > n {
            return Err(self.named(SpecError::Protocol(format!(
                "source returned {d} drafts for at most {n}"
            ))));
        }
        Ok(draft)
    }

    /// The length the controller asks of the source, within `remaining`
    /// unless the source drafts whole blocks (0 without a source).
    fn wanted_len(&self, remaining: usize) -> usize {
        match self.source.as_ref() {
            Some(src) if src.drafts_past_max_tokens() => self.controller.next_len(),
            Some(_) => self.controller.next_len().min(remaining),
            None => 0,
        }
    }

    /// The longest draft up to `n` that `caches` can still roll back (near
    /// a sliding window's end).
    fn rollback_len(n: usize, caches: &CacheSet) -> usize {
        if n > 0 && !caches.can_trim_after(n + 1, n) {
            (1..n)
                .rev()
                .find(|&m| caches.can_trim_after(m + 1, m))
                .unwrap_or(0)
        } else {
            n
        }
    }

    /// The next round as the goodput policy sees it (its cap: the length it
    /// would draft alone), when the policy may cut its length. A source
    /// that drafts cheaply drafts now, at that length, and the cap is what
    /// it proposed: a row whose lookup finds nothing is sized as a plain
    /// one, not as what it might have drafted. (An error of that draft
    /// surfaces from `draft`, where the round's errors fail the request.)
    pub(super) fn profile(
        &mut self,
        remaining: usize,
        history: &[u32],
        caches: &CacheSet,
        sampler: &mut dyn Sampler,
    ) -> Option<RowProfile> {
        if !self.goodput || self.source.is_none() {
            return None;
        }
        let mut cap = Self::rollback_len(self.wanted_len(remaining), caches);
        if cap > 0 && self.source.as_ref().is_some_and(|s| s.cheap_to_draft()) {
            let (asked, ahead) = match self.ahead.take() {
                Some(made) => made,
                None => (cap, self.ask(cap, history, caches, sampler)),
            };
            cap = ahead.as_ref().map_or(0, |d| d.tokens.len().min(cap));
            self.ahead = Some((asked, ahead));
        }
        Some(self.controller.profile(cap))
    }

    /// What this request's rounds measured, with its provider's id, where
    /// the goodput policy sizes its drafts.
    pub(super) fn learned(&self) -> Option<(&str, crate::priors::Learned)> {
        let provider = self.provider.as_deref().filter(|_| self.goodput)?;
        Some((provider, self.controller.learned()?))
    }

    /// Starts this request's estimates from what its provider's finished
    /// requests measured (`priors`), where the goodput policy sizes its
    /// drafts.
    pub(super) fn start_from(&mut self, priors: &crate::priors::ProviderPriors) {
        if !self.goodput {
            return;
        }
        if let Some(prior) = self.provider.as_deref().and_then(|p| priors.get(p)) {
            self.controller.start_from(prior);
        }
    }

    /// The next round drafts at most `len` of its `cap` tokens.
    pub(super) fn limit_to(&mut self, len: usize, cap: usize) {
        self.controller.note_allotted(len, cap);
        self.limit = Some(len);
    }

    /// The window's drafts under the request's constraint: the source's
    /// `drafts` cut at the first one it refuses, then (where the source
    /// syncs from the history or takes foreign tokens, or there is none)
    /// the tokens the constraint forces after those, as far as `remaining`
    /// and the caches' rollback allow; the masks of the window's positions
    /// are planned. Returns the drafts and how many are the source's.
    fn constrain(
        &mut self,
        drafts: &[u32],
        remaining: usize,
        caches: &CacheSet,
        stats: &mut SpecStats,
    ) -> Result<(Vec<u32>, usize), ServeError> {
        let Some(c) = self.constraint.as_mut() else {
            return Ok((drafts.to_vec(), drafts.len()));
        };
        let kept = c.allowed(drafts, stats)?;
        let mut window = drafts[..kept].to_vec();
        let foreign_ok = match self.source.as_ref() {
            Some(src) => src.syncs_from_history() || src.takes_foreign_tokens(),
            None => self.retired.is_none(),
        };
        if foreign_ok && c.drafts_forced() {
            let cap = remaining.min(kept + MAX_FORCED);
            let room = (kept..cap)
                .rev()
                .find(|&m| caches.can_trim_after(m + 2, m + 1))
                .map_or(0, |m| m + 1 - kept);
            let forced = c.forced(&window, room, stats)?;
            stats.forced_drafted += forced.len();
            window.extend(forced);
        }
        c.plan(window.clone());
        Ok((window, kept))
    }

    /// Computes the masks of the planned window (the step's forward runs
    /// meanwhile); verification computes them otherwise.
    pub(super) fn prepare_masks(&mut self, stats: &mut SpecStats) -> Result<(), ServeError> {
        match self.constraint.as_mut() {
            Some(c) => c.prepare_planned(stats),
            None => Ok(()),
        }
    }

    /// Verifies the current round's window (`logits` of every position),
    /// position by position, as one request alone does it: the processors
    /// see `history` then the drafts before each position.
    pub(super) fn walk(
        &mut self,
        logits: &Array,
        history: &[u32],
        processors: &mut [Box<dyn LogitsProcessor + Send>],
        sampler: &mut dyn Sampler,
        stats: &mut SpecStats,
    ) -> Result<(Drafted, Walked), ServeError> {
        let drafted = self.drafted.take().ok_or_else(|| {
            ServeError::Spec(SpecError::Internal("a verify window without a round"))
        })?;
        let tokens = &drafted.window;
        let d = tokens.len();
        let mut accepted = 0;
        let mut next = None;
        let mut walked = Vec::with_capacity(d + 1);
        let mut top = Vec::with_capacity(d + 1);
        // The source's probabilities cover its own (kept) drafts; forced
        // ones are point proposals.
        let draft_probs = match (&drafted.draft.probs, self.rejection) {
            (Some(q), true) => Some(host_probs(q)?),
            _ => None,
        };
        let vocab = logits.shape().last().copied().unwrap_or(0) as usize;
        // What the processors see at position i: the history, then drafts[..i].
        let mut hist = history.to_vec();
        let mut complete = false;
        for i in 0..=d {
            if i > 0 {
                hist.push(tokens[i - 1]);
            }
            let mask = self.constraint.as_ref().and_then(|c| c.mask(i));
            if mask.is_some_and(|m| m.count() == 0 && m.end_allowed) {
                // Only the end may follow, and the request has no EOS
                // token: it ends after the accepted drafts.
                complete = true;
                break;
            }
            let lp = logprobs(
                &logits.index((.., i as i32, ..)),
                &hist,
                processors,
                mask,
                stats,
            )?;
            let t = if self.rejection {
                let p = host_probs(&sampler.probabilities(&lp)?)?;
                if i == d {
                    sample(&p, &mut self.rng)
                } else {
                    let q = draft_probs
                        .as_ref()
                        .filter(|_| i < drafted.kept)
                        .map(|q| &q[i * vocab..(i + 1) * vocab]);
                    match judge(&p, q, tokens[i], &mut self.rng) {
                        Verdict::Accept => tokens[i],
                        Verdict::Replace(t) => t,
                    }
                }
            } else {
                token_of(&sampler.sample(&lp)?)?
            };
            walked.push(chosen_logprob(&lp, t)?);
            top.push(top_logprobs(&lp, self.top_logprobs)?);
            if i < d && t == tokens[i] {
                accepted += 1;
            } else {
                next = Some(t);
                break;
            }
        }
        if let Some(c) = self.constraint.as_mut() {
            c.clear();
        }
        let next = match next {
            Some(t) => t,
            None if complete => 0,
            None => {
                return Err(ServeError::Spec(SpecError::Internal(
                    "verification produced no token",
                )))
            }
        };
        Ok((
            drafted,
            Walked {
                accepted,
                next,
                logprobs: walked,
                top,
                complete,
            },
        ))
    }

    /// Tells the source what verification found (the caches already
    /// trimmed), and sets up the next round: its anchor, pending token and
    /// feed.
    pub(super) fn commit(
        &mut self,
        drafted: &Drafted,
        walked: &Walked,
        hidden: &Array,
        taps: Option<&Array>,
    ) -> Result<(), ServeError> {
        let tokens = &drafted.window;
        let (d, accepted, next) = (tokens.len(), walked.accepted, walked.next);
        let own = drafted.draft.tokens.len();
        if let Some(src) = self.source.as_mut() {
            // The source hears of its own drafts: those the constraint cut
            // count as rejected. Forced tokens accepted past them are its
            // `foreign` tail when it takes one (`next` is then the
            // target's); otherwise the first is its round's next (a source
            // that syncs from the history reads the rest there).
            let mine = accepted.min(drafted.kept);
            let past = accepted > drafted.kept;
            let takes_foreign = past && src.takes_foreign_tokens();
            let foreign = if takes_foreign {
                &tokens[drafted.kept..accepted]
            } else {
                &[][..]
            };
            let its_next = if past && !takes_foreign {
                Some(tokens[drafted.kept])
            } else {
                (!walked.complete).then_some(next)
            };
            if let (Some(its_next), true) = (its_next, own > 0 || drafted.n > 0) {
                // The positions the source hears of: the pending token's,
                // its verified drafts' (foreign tokens' included).
                let verified = drafted.kept + foreign.len() + 1;
                let hidden_own;
                let taps_own;
                let (hidden_v, taps_v) = if d + 1 > verified {
                    let rows = verified as i32;
                    hidden_own = hidden.index((.., ..rows, ..));
                    taps_own = taps.map(|t| t.index((.., ..rows, ..)));
                    (&hidden_own, taps_own.as_ref())
                } else {
                    (hidden, taps)
                };
                let info = CommitInfo {
                    drafted: own,
                    accepted: mine,
                    accepted_tokens: &tokens[..mine],
                    foreign,
                    next: its_next,
                    verified_taps: taps_v,
                    verified_hidden: hidden_v,
                };
                if let Err(e) = src.commit(info) {
                    return Err(self.named(e));
                }
            }
        }
        self.controller
            .observe(drafted.kept, accepted.min(drafted.kept));
        self.anchor = Some(hidden.index((.., accepted as i32..accepted as i32 + 1, ..)));
        self.pending = next;
        // A source whose drafts the constraint cut saw a rejection.
        self.feed = if d > 0 && accepted == d && drafted.kept == own {
            vec![tokens[d - 1], next]
        } else {
            vec![next]
        };
        Ok(())
    }

    /// Tells the source (or the retired one) how the request ended.
    pub(super) fn finish(&mut self, outcome: RequestOutcome) {
        if let Some(src) = self.source.as_mut().or(self.retired.as_mut()) {
            src.finish(outcome);
        }
    }
}

impl Drafted {
    /// The window's drafts.
    pub(super) fn tokens(&self) -> &[u32] {
        &self.window
    }

    /// How many of them the constraint forced.
    pub(super) fn forced(&self) -> usize {
        self.window.len() - self.kept
    }
}
