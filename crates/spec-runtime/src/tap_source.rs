//! The draft/commit protocol of a source whose context is the target's taps
//! (DSpark, DFlash): what it checks and keeps between rounds, whatever the
//! drafter computes. Invariant between rounds: the context holds the
//! target's taps of every token before the pending one. A protocol
//! violation poisons the state: every later call fails instead of drafting
//! from a context out of step with the target.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::{CommitInfo, DraftRequest, InputError, SavedDraft, SpecError};

use crate::tap_context::{tap_rows, SavedTapContext, TapContext};

/// Appends taps `[1, L, width]` to a context (the drafter's projection).
pub type Extend<'a> = &'a dyn Fn(&mut TapContext, &Array) -> Result<(), SpecError>;

/// One request's context and protocol state.
#[derive(Debug)]
pub struct TapProtocol {
    /// The provider id, in messages.
    id: &'static str,
    ctx: TapContext,
    prefilled: bool,
    /// Tokens of the last draft, until its commit.
    outstanding: Option<Vec<u32>>,
    poisoned: Option<String>,
}

impl TapProtocol {
    /// A fresh state for provider `id`.
    pub fn new(id: &'static str) -> Self {
        Self {
            id,
            ctx: TapContext::default(),
            prefilled: false,
            outstanding: None,
            poisoned: None,
        }
    }

    /// The context.
    pub fn context(&self) -> &TapContext {
        &self.ctx
    }

    fn check_usable(&self) -> Result<(), SpecError> {
        match &self.poisoned {
            Some(why) => Err(SpecError::Protocol(format!(
                "{} source unusable after an earlier violation: {why}",
                self.id
            ))),
            None => Ok(()),
        }
    }

    fn poison(&mut self, why: String) -> SpecError {
        self.poisoned = Some(why.clone());
        SpecError::Protocol(why)
    }

    fn check_fresh(&self) -> Result<(), SpecError> {
        self.check_usable()?;
        if self.prefilled {
            return Err(SpecError::Protocol(format!(
                "prefill on a {} source that already ran",
                self.id
            )));
        }
        Ok(())
    }

    /// Tail-split prefill: the taps of `prompt[..len-1]`, one row each.
    pub fn prefill(
        &mut self,
        prompt: &[u32],
        taps: Option<&Array>,
        extend: Extend<'_>,
    ) -> Result<(), SpecError> {
        self.check_fresh()?;
        let expected = prompt.len().saturating_sub(1);
        if tap_rows(taps) != Some(expected) {
            return Err(InputError::Shape {
                what: "a tapping drafter's prefill taps",
                expected: format!("{expected} rows, one per prefilled prompt token"),
                got: taps.map(|t| t.shape().to_vec()).into_iter().collect(),
            }
            .into());
        }
        if let Some(t) = taps.filter(|_| expected > 0) {
            extend(&mut self.ctx, t)?;
        }
        self.prefilled = true;
        Ok(())
    }

    /// The context right after a prefill, for a prefix cache.
    pub fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        if !self.prefilled || self.outstanding.is_some() || self.poisoned.is_some() {
            return None;
        }
        Some(Box::new(SavedTapContext(self.ctx.clone())))
    }

    /// Keeps the saved context's first `keep` rows and appends the taps of
    /// `prompt[keep..len-1]` (`taps` holds exactly those rows); `false` when
    /// `saved` is not a context or covers fewer rows.
    pub fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
        extend: Extend<'_>,
    ) -> Result<bool, SpecError> {
        self.check_fresh()?;
        let Some(SavedTapContext(ctx)) = saved.as_any().downcast_ref::<SavedTapContext>() else {
            return Ok(false);
        };
        let expected = prompt.len().saturating_sub(1);
        let Some(kept) = ctx.truncated(keep).filter(|_| keep <= expected) else {
            return Ok(false);
        };
        if tap_rows(taps) != Some(expected - keep) {
            return Err(InputError::Shape {
                what: "a tapping drafter's prefill taps after saved rows",
                expected: format!(
                    "{} rows, one per prompt token after the {keep} saved",
                    expected - keep
                ),
                got: taps.map(|t| t.shape().to_vec()).into_iter().collect(),
            }
            .into());
        }
        self.ctx = kept;
        if let Some(t) = taps.filter(|_| expected > keep) {
            extend(&mut self.ctx, t)?;
        }
        self.prefilled = true;
        Ok(true)
    }

    /// Checks a draft request against the state; returns the anchor (the
    /// pending token).
    pub fn begin_draft(&mut self, request: &DraftRequest<'_>) -> Result<u32, SpecError> {
        self.check_usable()?;
        let id = self.id;
        if !self.prefilled {
            return Err(SpecError::Protocol(format!("{id} draft before prefill")));
        }
        if self.outstanding.is_some() {
            return Err(self.poison(format!(
                "{id} draft called before the previous draft was committed"
            )));
        }
        let Some(&anchor) = request.feed.last() else {
            return Err(SpecError::Protocol(format!(
                "{id} draft needs a non-empty feed"
            )));
        };
        if request.max_tokens == 0 {
            return Err(SpecError::Protocol(format!(
                "{id} draft asked for 0 tokens"
            )));
        }
        let expected = request.history.len().saturating_sub(1);
        if self.ctx.len() != expected || request.history.last() != Some(&anchor) {
            let why = format!(
                "{id} context holds {} rows but the request's history implies {expected} before the pending token",
                self.ctx.len()
            );
            return Err(self.poison(why));
        }
        Ok(anchor)
    }

    /// Records the draft handed out, until its commit.
    pub fn drafted(&mut self, tokens: Vec<u32>) {
        self.outstanding = Some(tokens);
    }

    /// Checks a commit against the outstanding draft and appends the
    /// verified taps of the pending token, the accepted drafts and the
    /// foreign tokens (taps `[1, rows, width]`); rejected rows are dropped.
    pub fn commit(
        &mut self,
        info: CommitInfo<'_>,
        width: i32,
        extend: Extend<'_>,
    ) -> Result<(), SpecError> {
        self.check_usable()?;
        let id = self.id;
        let Some(drafted) = self.outstanding.take() else {
            return Err(self.poison(format!("{id} commit without a draft")));
        };
        if info.drafted != drafted.len()
            || info.accepted > info.drafted
            || info.accepted_tokens != &drafted[..info.accepted.min(drafted.len())]
        {
            let why = format!(
                "{id} commit of {} accepted of {} drafted (and {} foreign) does not match the draft {drafted:?}",
                info.accepted,
                info.drafted,
                info.foreign.len()
            );
            return Err(self.poison(why));
        }
        // Foreign tokens are context like accepted drafts.
        let accepted = info.accepted + info.foreign.len();
        let verified = if info.foreign.is_empty() {
            info.accepted + 1..=info.drafted + 1
        } else {
            accepted + 1..=accepted + 1
        };
        let Some(taps) = info.verified_taps else {
            return Err(self.poison(format!(
                "{id} commit without the verify window's tapped hidden states"
            )));
        };
        if taps.ndim() != 3
            || taps.shape()[0] != 1
            || !verified.contains(&(taps.shape()[1] as usize))
            || taps.shape()[2] != width
        {
            let why = format!(
                "{id} commit: verified taps of shape {:?}, expected [1, {}..={}, {width}]",
                taps.shape(),
                verified.start(),
                verified.end()
            );
            return Err(self.poison(why));
        }
        let kept = taps.index((.., ..(accepted as i32 + 1), ..));
        if let Err(e) = extend(&mut self.ctx, &kept) {
            // The context is now out of step with the target: later calls
            // are refused, and this one returns the drafter's own error.
            self.poisoned = Some(format!("{id} commit failed to extend the context: {e}"));
            return Err(e);
        }
        Ok(())
    }
}
