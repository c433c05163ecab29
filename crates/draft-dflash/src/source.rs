//! The per-request source of `dflash`: the projected context of one request
//! (the protocol in `spec_runtime::tap_source`) and one block per round.

use std::rc::Rc;

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, PrefillMode, Sampler, SavedDraft, SpecError,
    Target,
};
use spec_runtime::tap_context::TapContext;
use spec_runtime::tap_source::TapProtocol;

use crate::model::{BlockProposal, DFlashModel};

/// Drafts one block per round from the request's context.
#[derive(Debug)]
pub struct DFlashSource<'t> {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<DFlashModel>,
    /// Whose embeddings and head the drafter uses.
    target: &'t dyn Target,
    state: TapProtocol,
    /// The last block proposal, for inspection by tests and the oracle gate.
    last: Option<BlockProposal>,
}

impl<'t> DFlashSource<'t> {
    /// A source with an empty context, drafting for `target`.
    pub fn new(model: Rc<DFlashModel>, target: &'t dyn Target) -> Self {
        Self {
            model,
            target,
            state: TapProtocol::new(crate::ID),
            last: None,
        }
    }

    /// Context rows held.
    pub fn context_len(&self) -> usize {
        self.state.context().len()
    }

    /// The last block proposal.
    pub fn last_proposal(&self) -> Option<&BlockProposal> {
        self.last.as_ref()
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
        let model = &self.model;
        let extend = |ctx: &mut TapContext, t: &Array| Ok(model.extend_context(ctx, t)?);
        self.state.prefill(prompt, taps, &extend)
    }

    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        self.state.save_prefill()
    }

    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
    ) -> Result<bool, SpecError> {
        let model = &self.model;
        let extend = |ctx: &mut TapContext, t: &Array| Ok(model.extend_context(ctx, t)?);
        self.state.prefill_from(saved, keep, prompt, taps, &extend)
    }

    /// One block of `min(block_size, max_tokens + 1)` positions (as
    /// `model_mlx.py` shrinks the last block): `width - 1` drafts.
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let anchor = self.state.begin_draft(&request)?;
        let width = self.model.config().block_size.min(request.max_tokens + 1);
        let proposal =
            self.model
                .propose(self.target, self.state.context(), anchor, width, sampler)?;
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
        self.state.drafted(tokens.clone());
        Ok(Draft { tokens, probs })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let model = &self.model;
        let extend = |ctx: &mut TapContext, t: &Array| {
            model
                .extend_context(ctx, t)
                .map_err(|e| SpecError::provider_failed(crate::ID, e))
        };
        let width = model.config().context_width();
        self.state.commit(info, width, &extend)
    }
}
