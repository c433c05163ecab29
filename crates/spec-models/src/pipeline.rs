//! Pipeline-parallel slices of a model: which decoder layers a rank holds
//! (mlx-lm 0.32.2's `PipelineMixin.pipeline` split: rank 0 holds the last
//! layers and the output head, rank `size - 1` the first ones; the low ranks
//! take the extra layers of an uneven split), and the [`Stage`] view a
//! pipeline runs a rank's slice through. Every rank holds the embedding
//! (as in mlx-lm); only rank 0 holds the final norm, the head and GLM's MTP
//! row. Other ranks' layer tensors are discarded by rule when loading.

use std::ops::Range;
use std::path::Path;

use mlx_rs::{Array, Dtype};
use spec_core::{BatchRow, CacheSet, SpecError, Target};

use crate::config::{read_config, ConfigHeader};
use crate::{architectures, LoadOptions, ModelError};

/// Why a model cannot be split into the pipeline asked for (the error
/// type lives with `ModelError` in the runtime).
pub use spec_runtime::error::SplitError;

/// One rank's place in a pipeline of `size` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSlice {
    rank: usize,
    size: usize,
}

impl PipelineSlice {
    /// The whole model in one process.
    pub const SINGLE: Self = Self { rank: 0, size: 1 };

    /// Rank `rank` of a pipeline of `size` ranks.
    pub fn new(rank: usize, size: usize) -> Result<Self, ModelError> {
        if size == 0 || rank >= size {
            return Err(SplitError::NotARank { rank, size }.into());
        }
        Ok(Self { rank, size })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the pipeline.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this rank holds the last layers, the final norm and the head.
    pub fn holds_head(&self) -> bool {
        self.rank == 0
    }

    /// Whether this rank runs the first layers (from the embeddings).
    pub fn holds_first(&self) -> bool {
        self.rank + 1 == self.size
    }

    /// The decoder layers of rank `rank` out of `layers`.
    pub fn layers_of(rank: usize, size: usize, layers: usize) -> Result<Range<usize>, ModelError> {
        if layers < size {
            return Err(SplitError::TooFewLayers { size, layers }.into());
        }
        let (base, extra) = (layers / size, layers % size);
        let count = |r: usize| base + usize::from(r < extra);
        let start: usize = (rank + 1..size).map(count).sum();
        Ok(start..start + count(rank))
    }

    /// This rank's decoder layers out of `layers`.
    pub fn layers(&self, layers: usize) -> Result<Range<usize>, ModelError> {
        Self::layers_of(self.rank, self.size, layers)
    }

    /// The layers of rank `rank` when a rank may only start at a layer for
    /// which `may_start` holds (layer 0 always may): each boundary of the
    /// even split moves down to the nearest such layer. GLM-5.2's
    /// IndexShare layers reuse the picks of the full layer before them, so
    /// a rank starts at a full layer.
    pub fn layers_aligned(
        rank: usize,
        size: usize,
        layers: usize,
        may_start: impl Fn(usize) -> bool,
    ) -> Result<Range<usize>, ModelError> {
        // Starts of ranks size-1 (0), size-2, .., 0, ascending.
        let mut starts = vec![0];
        for r in (0..size.saturating_sub(1)).rev() {
            let prev = starts.last().copied().unwrap_or(0);
            let mut start = Self::layers_of(r, size, layers)?.start;
            while start > prev + 1 && !may_start(start) {
                start -= 1;
            }
            if !may_start(start) {
                return Err(SplitError::NoStart {
                    rank: r,
                    size,
                    from: prev + 1,
                    to: Self::layers_of(r, size, layers)?.start,
                }
                .into());
            }
            starts.push(start);
        }
        let at = size - 1 - rank;
        let start = starts[at];
        let end = starts.get(at + 1).copied().unwrap_or(layers);
        Ok(start..end)
    }
}

/// The decoder-layer index a tensor name of `model.layers.{i}.*` belongs to.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// One rank's part of a model, as a pipeline runs it.
pub trait Stage: std::fmt::Debug + Send {
    /// The rank's place.
    fn slice(&self) -> PipelineSlice;
    /// The decoder layers held (global indices).
    fn layer_range(&self) -> Range<usize>;
    /// The decoder layers rank `rank` of this pipeline holds.
    fn rank_layers(&self, rank: usize) -> Result<Range<usize>, ModelError>;
    /// Fresh caches for this rank's layers of one request.
    fn stage_caches(&self) -> CacheSet;
    /// The dtype of the hidden states passed between ranks.
    fn hidden_dtype(&self) -> Result<Dtype, SpecError>;
    /// Runs the held layers over the packed rows: from the token embeddings
    /// when `input` is `None` (the first stage), else from the previous
    /// stage's `[1, T, hidden]` output. Returns the last held layer's output
    /// (before the final norm) and the outputs of the held layers listed in
    /// `taps` (global indices), in layer order.
    fn run_stage(
        &self,
        input: Option<&Array>,
        rows: &mut [BatchRow<'_>],
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError>;
    /// The final norm (rank 0 only).
    fn finish(&self, h: &Array) -> Result<Array, SpecError>;
    /// The model as a target: info, logits, embeddings and `as_any` are the
    /// whole model's; its forwards refuse (they need the other ranks).
    fn target(&self) -> &(dyn Target + Send);
}

/// Loads rank `slice`'s part of the model at `dir` (the llama family and
/// `glm_moe_dsa`).
pub fn load_stage(
    dir: &Path,
    options: &LoadOptions,
    slice: PipelineSlice,
) -> Result<Box<dyn Stage>, ModelError> {
    let _span = tracing::info_span!("load_stage", path = %dir.display(), rank = slice.rank, size = slice.size).entered();
    let (header, path): (ConfigHeader, _) = read_config(dir)?;
    let stage = architectures::architecture(&header.model_type)
        .and_then(|family| family.load_stage(dir, options, slice));
    stage.unwrap_or_else(|| {
        Err(ModelError::Config {
            path,
            message: format!(
                "`{}` has no pipeline split here ({} do)",
                header.model_type,
                architectures::splittable().join(", ")
            ),
        })
    })
}

/// The error of a forward asked of a pipeline slice directly.
pub(crate) fn partial_forward(
    slice: PipelineSlice,
    layers: &Range<usize>,
    total: usize,
) -> SpecError {
    spec_core::InputError::PipelineStage {
        start: layers.start,
        end: layers.end,
        total,
        rank: slice.rank,
        size: slice.size,
    }
    .into()
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod chained_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn check(size: usize, layers: usize, expected: &[Range<usize>]) {
        let got: Vec<_> = (0..size)
            .map(|r| PipelineSlice::layers_of(r, size, layers).expect("split"))
            .collect();
        assert_eq!(got, expected, "{size} ranks over {layers} layers");
    }

    #[test]
    fn split_follows_mlx_lm() {
        // Rank 0 holds the last layers; the low ranks take the extra ones.
        check(1, 4, std::slice::from_ref(&(0..4)));
        check(2, 4, &[2..4, 0..2]);
        check(2, 5, &[2..5, 0..2]);
        check(3, 30, &[20..30, 10..20, 0..10]);
        check(3, 8, &[5..8, 2..5, 0..2]);
    }

    #[test]
    fn aligned_splits_start_ranks_where_allowed() {
        // GLM-5.2-like: full layers 0, 1, 2, then every fourth from 6.
        let full = |i: usize| i < 3 || (i >= 6 && (i - 2).is_multiple_of(4));
        let ranks = |size| -> Vec<Range<usize>> {
            (0..size)
                .map(|r| PipelineSlice::layers_aligned(r, size, 78, full).expect("split"))
                .collect()
        };
        assert_eq!(ranks(2), [38..78, 0..38]);
        assert_eq!(ranks(3), [50..78, 26..50, 0..26]);
        // FFSFS (the gate's glm52): two ranks split at layer 1, not 2.
        let ffsfs = |i: usize| [true, true, false, true, false][i];
        assert_eq!(
            PipelineSlice::layers_aligned(0, 2, 5, ffsfs).expect("split"),
            1..5
        );
        assert_eq!(
            PipelineSlice::layers_aligned(1, 2, 5, ffsfs).expect("split"),
            0..1
        );
        // Every layer allowed: the even split.
        assert_eq!(
            PipelineSlice::layers_aligned(1, 3, 8, |_| true).expect("split"),
            2..5
        );
        // No full layer to start at.
        assert!(matches!(
            PipelineSlice::layers_aligned(0, 2, 4, |i| i == 0),
            Err(ModelError::Pipeline(SplitError::NoStart { rank: 0, .. }))
        ));
    }

    #[test]
    fn too_few_layers_or_bad_rank_is_an_error() {
        assert!(matches!(
            PipelineSlice::layers_of(0, 3, 2),
            Err(ModelError::Pipeline(SplitError::TooFewLayers {
                size: 3,
                layers: 2
            }))
        ));
        assert!(matches!(
            PipelineSlice::new(3, 3),
            Err(ModelError::Pipeline(SplitError::NotARank {
                rank: 3,
                size: 3
            }))
        ));
        assert!(matches!(
            PipelineSlice::new(0, 0),
            Err(ModelError::Pipeline(SplitError::NotARank { .. }))
        ));
    }

    #[test]
    fn layer_of_reads_the_index() {
        assert_eq!(layer_of("model.layers.12.mlp.up_proj.weight"), Some(12));
        assert_eq!(layer_of("model.norm.weight"), None);
    }
}
