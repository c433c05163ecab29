//! The per-request source of a block drafter on the target's taps (DSpark,
//! DFlash): the protocol of `tap_source` around one block proposal per
//! round. A drafter says how it projects taps and proposes a block
//! ([`BlockDrafter`]); [`BlockSource`] does the rest.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, PrefillMode, Sampler, SavedDraft, SpecError,
};

use crate::tap_context::TapContext;
use crate::tap_source::TapProtocol;

/// One block forward's proposal, before any cut.
#[derive(Debug)]
pub struct BlockProposal {
    /// The block's tokens, each drawn with the request's sampler.
    pub tokens: Vec<u32>,
    /// The log-probabilities each token was drawn from, `[1, V]` per token.
    pub logprobs: Vec<Array>,
    /// The confidence of each token, when the drafter has a confidence
    /// head (DSpark).
    pub confidences: Option<Vec<f32>>,
}

/// What a block drafter supplies to [`BlockSource`].
pub trait BlockDrafter {
    /// The drafter's own error, turned into a [`SpecError`] where a call
    /// fails.
    type Error: Into<SpecError> + std::error::Error + Send + Sync + 'static;

    /// The provider id, in messages.
    fn id(&self) -> &'static str;

    /// The target layers whose hidden states the drafter reads.
    fn tap_layers(&self) -> &[usize];

    /// The width of a tap row (the tapped layers' hidden states, concatenated).
    fn context_width(&self) -> i32;

    /// Appends the projection of `taps` (`[1, L, width]`) to `ctx`.
    fn extend_context(&self, ctx: &mut TapContext, taps: &Array) -> Result<(), Self::Error>;

    /// One block from `ctx` after `anchor` (the pending token), for a
    /// request that takes at most `max_tokens` drafts.
    fn propose(
        &self,
        ctx: &TapContext,
        anchor: u32,
        max_tokens: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<BlockProposal, Self::Error>;

    /// How many of `proposal`'s tokens to draft, at most `max` (default:
    /// all that fit).
    fn kept(&self, proposal: &BlockProposal, max: usize) -> usize {
        proposal.tokens.len().min(max)
    }
}

/// Drafts one block per round from the request's context. Invariant between
/// rounds: the context holds the target's taps of every token before the
/// pending one.
#[derive(Debug)]
pub struct BlockSource<D> {
    drafter: D,
    state: TapProtocol,
    /// The last block proposal, before any cut, for inspection by tests and
    /// the oracle gates.
    last: Option<BlockProposal>,
}

impl<D: BlockDrafter> BlockSource<D> {
    /// A source with an empty context.
    pub fn new(drafter: D) -> Self {
        let state = TapProtocol::new(drafter.id());
        Self {
            drafter,
            state,
            last: None,
        }
    }

    /// Context rows held.
    pub fn context_len(&self) -> usize {
        self.state.context().len()
    }

    /// The last block proposal, before any cut.
    pub fn last_proposal(&self) -> Option<&BlockProposal> {
        self.last.as_ref()
    }
}

impl<D: BlockDrafter> DraftSource for BlockSource<D> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::TailSplit
    }

    fn tap_layers(&self) -> &[usize] {
        self.drafter.tap_layers()
    }

    /// Foreign tokens' taps join the context as accepted drafts' do.
    fn takes_foreign_tokens(&self) -> bool {
        true
    }

    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        let d = &self.drafter;
        let extend = |ctx: &mut TapContext, t: &Array| d.extend_context(ctx, t).map_err(Into::into);
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
        let d = &self.drafter;
        let extend = |ctx: &mut TapContext, t: &Array| d.extend_context(ctx, t).map_err(Into::into);
        self.state.prefill_from(saved, keep, prompt, taps, &extend)
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let anchor = self.state.begin_draft(&request)?;
        let proposal = self
            .drafter
            .propose(self.state.context(), anchor, request.max_tokens, sampler)
            .map_err(Into::into)?;
        let d = self.drafter.kept(&proposal, request.max_tokens);
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
            provider = self.drafter.id(),
            anchor,
            drafted = d,
            block = proposal.tokens.len(),
            "block draft"
        );
        self.last = Some(proposal);
        self.state.drafted(tokens.clone());
        Ok(Draft { tokens, probs })
    }

    /// A failure to extend the context here comes back as the provider's,
    /// with its id.
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let d = &self.drafter;
        let extend = |ctx: &mut TapContext, t: &Array| {
            d.extend_context(ctx, t)
                .map_err(|e| SpecError::provider_failed(d.id(), e))
        };
        self.state.commit(info, d.context_width(), &extend)
    }
}
