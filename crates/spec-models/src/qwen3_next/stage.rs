//! A hybrid model split across pipeline ranks: each rank holds its slice
//! of the layers (recurrent and attention alike, their caches with them).
//! Rank 0's caches decide how far a round may roll back, and only a
//! recurrent cache knows its limit (the positions it keeps), so rank 0
//! must hold a Gated DeltaNet layer when any rank does; the other ranks'
//! recurrent caches, never told of commits, keep their last
//! `ROLLBACK_LIMIT` positions and follow every trim rank 0 allows.

use std::ops::Range;

use mlx_rs::Array;
use spec_core::SpecError;

use super::config::{Config, Mixer};
use super::Model;
use crate::batch::Packed;
use crate::family::StageFamily;
use crate::layers::RmsNorm;
use crate::pipeline::{PipelineSlice, SplitError};
use crate::ModelError;

/// The layers `slice` holds (all without one), refusing a split whose rank
/// 0 holds no recurrent layer.
pub(super) fn held(
    config: &Config,
    slice: Option<PipelineSlice>,
) -> Result<Range<usize>, ModelError> {
    let layers = config.mixers.len();
    let Some(s) = slice else {
        return Ok(0..layers);
    };
    if s.size() > 1 {
        let head = PipelineSlice::layers_of(0, s.size(), layers)?;
        if !config.mixers[head.clone()].contains(&Mixer::Linear) {
            return Err(SplitError::NoRecurrentOnHead {
                start: head.start,
                end: head.end,
            }
            .into());
        }
    }
    s.layers(layers)
}

impl StageFamily for Model {
    fn stage_slice(&self) -> Option<PipelineSlice> {
        self.slice
    }

    fn held_layers(&self) -> Range<usize> {
        self.range.clone()
    }

    fn layers_of_rank(&self, rank: usize, size: usize) -> Result<Range<usize>, ModelError> {
        PipelineSlice::layers_of(rank, size, self.config.mixers.len())
    }

    fn check_stage(&self, packed: &Packed<'_>) -> Result<(), SpecError> {
        let layers = self.blocks.len();
        packed.check(layers, layers, "one per layer", &[], 1)
    }

    fn run_held(
        &self,
        h: Array,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        self.run_layers(h, packed, taps)
    }

    fn final_norm(&self) -> Option<&RmsNorm> {
        self.norm.as_ref()
    }

    fn partial(&self) -> SpecError {
        Model::partial(self)
    }
}
