//! The per-request source of `dflash`: DFlash's block on the shared
//! block-drafter source (`spec_runtime::block_source`), every token of the
//! block drafted.

use std::rc::Rc;

use mlx_rs::Array;
use spec_core::{Sampler, Target};
use spec_runtime::block_source::{BlockDrafter, BlockProposal, BlockSource};
use spec_runtime::tap_context::TapContext;

use crate::error::DFlashError;
use crate::model::DFlashModel;

/// Drafts one DFlash block per round from the request's context.
pub type DFlashSource<'t> = BlockSource<DFlashDrafter<'t>>;

/// DFlash as a block drafter: the drafter and the target whose embeddings
/// and head it uses.
#[derive(Debug)]
pub struct DFlashDrafter<'t> {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<DFlashModel>,
    target: &'t dyn Target,
}

impl<'t> DFlashDrafter<'t> {
    /// The drafter `model`, drafting for `target`.
    pub fn new(model: Rc<DFlashModel>, target: &'t dyn Target) -> Self {
        Self { model, target }
    }
}

impl BlockDrafter for DFlashDrafter<'_> {
    type Error = DFlashError;

    fn id(&self) -> &'static str {
        crate::ID
    }

    fn tap_layers(&self) -> &[usize] {
        &self.model.config().target_layer_ids
    }

    fn context_width(&self) -> i32 {
        self.model.config().context_width()
    }

    fn extend_context(&self, ctx: &mut TapContext, taps: &Array) -> Result<(), DFlashError> {
        self.model.extend_context(ctx, taps)
    }

    /// One block of `min(block_size, max_tokens + 1)` positions (as
    /// `model_mlx.py` shrinks the last block): `width - 1` drafts.
    fn propose(
        &self,
        ctx: &TapContext,
        anchor: u32,
        max_tokens: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<BlockProposal, DFlashError> {
        let width = self.model.config().block_size.min(max_tokens + 1);
        self.model.propose(self.target, ctx, anchor, width, sampler)
    }
}
