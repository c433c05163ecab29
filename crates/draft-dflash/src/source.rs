//! The per-request source of `dflash`: the projected context of one request
//! and the draft/commit protocol around it.

use std::rc::Rc;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, InputError, PrefillMode, Sampler, SavedDraft,
    SpecError, Target,
};
use spec_runtime::tap_context::{tap_rows, SavedTapContext, TapContext};

use crate::model::{BlockProposal, DFlashModel};

/// Drafts one block per round from the request's context. Invariant between
/// rounds: the context holds the target's taps of every token before the
/// pending one.
#[derive(Debug)]
pub struct DFlashSource<'t> {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<DFlashModel>,
    /// Whose embeddings and head the drafter uses.
    target: &'t dyn Target,
    ctx: TapContext,
    prefilled: bool,
    /// Tokens of the last draft, until its commit.
    outstanding: Option<Vec<u32>>,
    /// The last block proposal, for inspection by tests and the oracle gate.
    last: Option<BlockProposal>,
    /// Set by a protocol violation: the context may be out of step, so every
    /// later call fails instead of drafting from a wrong context.
    poisoned: Option<String>,
}

impl<'t> DFlashSource<'t> {
    /// A source with an empty context, drafting for `target`.
    pub fn new(model: Rc<DFlashModel>, target: &'t dyn Target) -> Self {
        Self {
            model,
            target,
            ctx: TapContext::default(),
            prefilled: false,
            outstanding: None,
            last: None,
            poisoned: None,
        }
    }

    /// Context rows held.
    pub fn context_len(&self) -> usize {
        self.ctx.len()
    }

    /// The last block proposal.
    pub fn last_proposal(&self) -> Option<&BlockProposal> {
        self.last.as_ref()
    }

    fn check_usable(&self) -> Result<(), SpecError> {
        match &self.poisoned {
            Some(why) => Err(SpecError::Protocol(format!(
                "dflash source unusable after an earlier violation: {why}"
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
            return Err(SpecError::Protocol(
                "prefill on a dflash source that already ran".into(),
            ));
        }
        Ok(())
    }
}

impl DraftSource for DFlashSource<'_> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::TailSplit
    }

    fn tap_layers(&self) -> &[usize] {
        &self.model.config().target_layer_ids
    }

    /// Foreign tokens' taps join the context as accepted drafts' do.
    fn takes_foreign_tokens(&self) -> bool {
        true
    }

    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        self.check_fresh()?;
        // Tail-split: the target saw every prompt token but the last (pending) one.
        let expected = prompt.len().saturating_sub(1);
        if tap_rows(taps) != Some(expected) {
            return Err(InputError::Shape {
                what: "dflash prefill's tapped target hidden states",
                expected: format!("{expected} rows, one per prefilled prompt token"),
                got: taps.map(|t| t.shape().to_vec()).into_iter().collect(),
            }
            .into());
        }
        if let Some(t) = taps.filter(|_| expected > 0) {
            self.model.extend_context(&mut self.ctx, t)?;
        }
        self.prefilled = true;
        Ok(())
    }

    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        if !self.prefilled || self.outstanding.is_some() || self.poisoned.is_some() {
            return None;
        }
        Some(Box::new(SavedTapContext(self.ctx.clone())))
    }

    /// Keeps the saved context's first `keep` rows and projects the taps of
    /// `prompt[keep..len-1]` after them.
    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
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
                what: "the tapped hidden states of a dflash prefill from saved rows",
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
            self.model.extend_context(&mut self.ctx, t)?;
        }
        self.prefilled = true;
        Ok(true)
    }

    /// One block of `min(block_size, max_tokens + 1)` positions (as
    /// `model_mlx.py` shrinks the last block): `width - 1` drafts.
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.check_usable()?;
        if !self.prefilled {
            return Err(SpecError::Protocol("dflash draft before prefill".into()));
        }
        if self.outstanding.is_some() {
            return Err(
                self.poison("dflash draft called before the previous draft was committed".into())
            );
        }
        let Some(&anchor) = request.feed.last() else {
            return Err(SpecError::Protocol(
                "dflash draft needs a non-empty feed".into(),
            ));
        };
        if request.max_tokens == 0 {
            return Err(SpecError::Protocol(
                "dflash draft asked for 0 tokens".into(),
            ));
        }
        let expected = request.history.len().saturating_sub(1);
        if self.ctx.len() != expected || request.history.last() != Some(&anchor) {
            let why = format!(
                "dflash context holds {} rows but the request's history implies {expected} before the pending token",
                self.ctx.len()
            );
            return Err(self.poison(why));
        }
        let width = self.model.config().block_size.min(request.max_tokens + 1);
        let proposal = self
            .model
            .propose(self.target, &self.ctx, anchor, width, sampler)?;
        let tokens = proposal.tokens.clone();
        let probs = if sampler.is_greedy() {
            None
        } else {
            let rows: Vec<Array> = proposal
                .logprobs
                .iter()
                .map(|lp| sampler.probabilities(lp))
                .collect::<Result<_, _>>()?;
            Some(concatenate(&rows, 0)?)
        };
        tracing::trace!(anchor, drafted = tokens.len(), "dflash draft");
        self.last = Some(proposal);
        self.outstanding = Some(tokens.clone());
        Ok(Draft { tokens, probs })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.check_usable()?;
        let Some(drafted) = self.outstanding.take() else {
            return Err(self.poison("dflash commit without a draft".into()));
        };
        if info.drafted != drafted.len()
            || info.accepted > info.drafted
            || info.accepted_tokens != &drafted[..info.accepted.min(drafted.len())]
        {
            let why = format!(
                "dflash commit of {} accepted of {} drafted (and {} foreign) does not match the draft {drafted:?}",
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
            return Err(self
                .poison("dflash commit without the verify window's tapped hidden states".into()));
        };
        let width = self.model.config().context_width();
        if taps.ndim() != 3
            || taps.shape()[0] != 1
            || !verified.contains(&(taps.shape()[1] as usize))
            || taps.shape()[2] != width
        {
            let why = format!(
                "dflash commit: verified taps of shape {:?}, expected [1, {}..={}, {width}]",
                taps.shape(),
                verified.start(),
                verified.end()
            );
            return Err(self.poison(why));
        }
        // The pending token, the accepted drafts and the foreign tokens are
        // now context; the rejected rows are not.
        let kept = taps.index((.., ..(accepted as i32 + 1), ..));
        if let Err(e) = self.model.extend_context(&mut self.ctx, &kept) {
            self.poisoned = Some(format!("dflash commit failed to extend the context: {e}"));
            return Err(SpecError::provider_failed(crate::ID, e));
        }
        Ok(())
    }
}
