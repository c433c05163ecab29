//! The per-request source of `deepspec`: the projected context of one
//! request and the draft/commit protocol around it.

use std::rc::Rc;

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, PrefillMode, Sampler, SavedDraft, SpecError,
};

use spec_runtime::tap_source::TapProtocol;

use crate::model::{BlockProposal, Context, DSparkModel};

/// Drafts one block per round from the request's context. Invariant between
/// rounds: the context holds the target's taps of every token before the
/// pending one.
#[derive(Debug)]
pub struct DSparkSource {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<DSparkModel>,
    threshold: f32,
    state: TapProtocol,
    /// The last block before the confidence cut (tokens and confidences),
    /// for inspection by tests and the oracle gate.
    last: Option<BlockProposal>,
}

impl DSparkSource {
    /// A source with an empty context; `threshold` cuts a proposal at the
    /// first token whose confidence is below it (0: no cut).
    pub fn new(model: Rc<DSparkModel>, threshold: f32) -> Self {
        Self {
            model,
            threshold,
            state: TapProtocol::new(crate::ID),
            last: None,
        }
    }

    /// Context rows held.
    pub fn context_len(&self) -> usize {
        self.state.context().len()
    }

    /// The last block proposal, before the confidence cut.
    pub fn last_proposal(&self) -> Option<&BlockProposal> {
        self.last.as_ref()
    }

    /// Tokens kept of a proposal: the prefix before the first confidence
    /// under the threshold (all of them at threshold 0), at most `max`.
    fn kept(&self, proposal: &BlockProposal, max: usize) -> usize {
        let confident = match (&proposal.confidences, self.threshold > 0.0) {
            (Some(c), true) => c
                .iter()
                .position(|&c| c < self.threshold)
                .unwrap_or(c.len()),
            _ => proposal.tokens.len(),
        };
        confident.min(max)
    }
}

impl DraftSource for DSparkSource {
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
        let extend = |ctx: &mut Context, t: &Array| Ok(model.extend_context(ctx, t)?);
        self.state.prefill(prompt, taps, &extend)
    }

    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        self.state.save_prefill()
    }

    /// Keeps the saved context's first `keep` rows and projects the taps of
    /// `prompt[keep..len-1]` after them (`taps` holds exactly those rows:
    /// the host prefilled the target from `keep`).
    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
    ) -> Result<bool, SpecError> {
        let model = &self.model;
        let extend = |ctx: &mut Context, t: &Array| Ok(model.extend_context(ctx, t)?);
        self.state.prefill_from(saved, keep, prompt, taps, &extend)
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let anchor = self.state.begin_draft(&request)?;
        let proposal = self.model.propose(self.state.context(), anchor, sampler)?;
        let d = self.kept(&proposal, request.max_tokens);
        let tokens = proposal.tokens[..d].to_vec();
        let probs = if d > 0 && !sampler.is_greedy() {
            let rows: Vec<Array> = proposal.logprobs[..d]
                .iter()
                .map(|lp| sampler.probabilities(lp))
                .collect::<Result<_, _>>()?;
            Some(concatenate(&rows, 0)?)
        } else {
            None
        };
        tracing::trace!(
            anchor,
            drafted = d,
            block = proposal.tokens.len(),
            "deepspec draft"
        );
        self.last = Some(proposal);
        self.state.drafted(tokens.clone());
        Ok(Draft { tokens, probs })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let model = &self.model;
        let extend = |ctx: &mut Context, t: &Array| {
            model
                .extend_context(ctx, t)
                .map_err(|e| SpecError::provider_failed(crate::ID, e))
        };
        let width = model.config().context_width();
        self.state.commit(info, width, &extend)
    }
}
