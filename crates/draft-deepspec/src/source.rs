//! The per-request source of `deepspec`: DSpark's block on the shared
//! block-drafter source (`spec_runtime::block_source`), cut at the first
//! token under the confidence threshold.

use std::rc::Rc;

use mlx_rs::Array;
use spec_core::Sampler;
use spec_runtime::block_source::{BlockDrafter, BlockProposal, BlockSource};

use crate::error::DSparkError;
use crate::model::{Context, DSparkModel};

/// Drafts one DSpark block per round from the request's context.
pub type DSparkSource = BlockSource<DSparkDrafter>;

/// DSpark as a block drafter: the drafter and the request's threshold.
#[derive(Debug)]
pub struct DSparkDrafter {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<DSparkModel>,
    threshold: f32,
}

impl DSparkDrafter {
    /// `threshold` cuts a proposal at the first token whose confidence is
    /// below it (0: no cut).
    pub fn new(model: Rc<DSparkModel>, threshold: f32) -> Self {
        Self { model, threshold }
    }
}

impl BlockDrafter for DSparkDrafter {
    type Error = DSparkError;

    fn id(&self) -> &'static str {
        crate::ID
    }

    fn tap_layers(&self) -> &[usize] {
        &self.model.config().target_layer_ids
    }

    fn context_width(&self) -> i32 {
        self.model.config().context_width()
    }

    fn extend_context(&self, ctx: &mut Context, taps: &Array) -> Result<(), DSparkError> {
        self.model.extend_context(ctx, taps)
    }

    /// A whole block (`block_size` tokens) whatever the request's cap: the
    /// cut is [`Self::kept`]'s.
    fn propose(
        &self,
        ctx: &Context,
        anchor: u32,
        _max_tokens: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<BlockProposal, DSparkError> {
        self.model.propose(ctx, anchor, sampler)
    }

    /// The prefix before the first confidence under the threshold (all of
    /// the block at threshold 0), at most `max`.
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
