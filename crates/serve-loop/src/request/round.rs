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

use super::{chosen_logprob, host_probs, logprobs, token_of};
use crate::verify::{judge, sample, Verdict};
use crate::{DraftController, ServeError, SpecConfig};

/// A round's drafts, kept from `plan` to `absorb`.
pub(super) struct Drafted {
    draft: Draft,
    /// The draft length asked for.
    n: usize,
}

/// What verification of a window found.
pub(super) struct Walked {
    /// Drafts accepted.
    pub(super) accepted: usize,
    /// The token after them (the target's).
    pub(super) next: u32,
    /// Log-probabilities of the accepted drafts and `next`.
    pub(super) logprobs: Vec<f32>,
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
    ) -> Self {
        Self {
            provider,
            source,
            retired: None,
            controller: DraftController::new(config.num_draft, config.adaptive.clone()),
            rejection,
            rng: StdRng::seed_from_u64(config.seed),
            pending,
            feed: vec![pending],
            anchor: None,
            drafted: None,
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
        let mut n = match self.source.as_ref() {
            Some(src) if src.drafts_past_max_tokens() => self.controller.next_len(),
            Some(_) => self.controller.next_len().min(remaining),
            None => 0,
        };
        if n > 0 && !caches.can_trim_after(n + 1, n) {
            n = (1..n)
                .rev()
                .find(|&m| caches.can_trim_after(m + 1, m))
                .unwrap_or(0);
            if n == 0 {
                stats.untrimmable_fallback = true;
                self.retired = self.source.take();
            }
        }
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
        let mut tokens = Vec::with_capacity(d + 1);
        tokens.push(self.pending);
        tokens.extend_from_slice(&draft.tokens);
        self.drafted = Some(Drafted { draft, n });
        Ok(tokens)
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
    ) -> Result<(Drafted, Walked), ServeError> {
        let drafted = self.drafted.take().ok_or_else(|| {
            ServeError::Spec(SpecError::Internal("a verify window without a round"))
        })?;
        let draft = &drafted.draft;
        let d = draft.tokens.len();
        let mut accepted = 0;
        let mut next = None;
        let mut walked = Vec::with_capacity(d + 1);
        let draft_probs = match (&draft.probs, self.rejection) {
            (Some(q), true) => Some(host_probs(q)?),
            _ => None,
        };
        let vocab = logits.shape().last().copied().unwrap_or(0) as usize;
        // What the processors see at position i: the history, then drafts[..i].
        let mut hist = history.to_vec();
        for i in 0..=d {
            if i > 0 {
                hist.push(draft.tokens[i - 1]);
            }
            let lp = logprobs(&logits.index((.., i as i32, ..)), &hist, processors)?;
            let t = if self.rejection {
                let p = host_probs(&sampler.probabilities(&lp)?)?;
                if i == d {
                    sample(&p, &mut self.rng)
                } else {
                    let q = draft_probs.as_ref().map(|q| &q[i * vocab..(i + 1) * vocab]);
                    match judge(&p, q, draft.tokens[i], &mut self.rng) {
                        Verdict::Accept => draft.tokens[i],
                        Verdict::Replace(t) => t,
                    }
                }
            } else {
                token_of(&sampler.sample(&lp)?)?
            };
            walked.push(chosen_logprob(&lp, t)?);
            if i < d && t == draft.tokens[i] {
                accepted += 1;
            } else {
                next = Some(t);
                break;
            }
        }
        let next = next.ok_or_else(|| {
            ServeError::Spec(SpecError::Internal("verification produced no token"))
        })?;
        Ok((
            drafted,
            Walked {
                accepted,
                next,
                logprobs: walked,
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
        let tokens = &drafted.draft.tokens;
        let (d, accepted, next) = (tokens.len(), walked.accepted, walked.next);
        if let Some(src) = self.source.as_mut() {
            if d > 0 || drafted.n > 0 {
                let info = CommitInfo {
                    drafted: d,
                    accepted,
                    accepted_tokens: &tokens[..accepted],
                    next,
                    verified_taps: taps,
                    verified_hidden: hidden,
                };
                if let Err(e) = src.commit(info) {
                    return Err(self.named(e));
                }
            }
        }
        self.controller.observe(d, accepted);
        self.anchor = Some(hidden.index((.., accepted as i32..accepted as i32 + 1, ..)));
        self.pending = next;
        self.feed = if d > 0 && accepted == d {
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
    /// The drafts.
    pub(super) fn tokens(&self) -> &[u32] {
        &self.draft.tokens
    }
}
