//! What every architecture family's model shares, written once: the
//! `Target` implementation (`family_target!`, over [`Family`]) and the
//! pipeline `Stage` (a blanket implementation over [`StageFamily`]). A
//! family provides only what differs: its caches, its packed forward, its
//! head and embeddings, and for a stage its held layers.

use std::ops::Range;

use mlx_rs::{Array, Dtype};
use spec_core::{BatchRow, CacheSet, RowForm, SpecError, Target, TargetInfo, TargetOutput};

use crate::batch::{Packed, PackedForward};
use crate::layers::RmsNorm;
use crate::pipeline::{PipelineSlice, Stage};
use crate::ModelError;

/// What a family's model provides for `Target` (`family_target!`).
pub(crate) trait Family: PackedForward {
    /// How `Target::decode` runs its rows: as the prefill form (the
    /// default: the family's decoding rows are its prefill form) or as
    /// single queries.
    const DECODE_FORM: RowForm = RowForm::Prefill;
    /// `Target::split_invariant`.
    fn split_invariant(&self) -> bool;

    /// `Target::info`.
    fn target_info(&self) -> &TargetInfo;
    /// `Target::make_caches`.
    fn fresh_caches(&self) -> CacheSet;
    /// `Target::logits`.
    fn head_logits(&self, hidden: &Array) -> Result<Array, SpecError>;
    /// `Target::logits_before_softcap`: `head_logits` unless the model
    /// softcaps its logits.
    fn head_logits_before_softcap(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.head_logits(hidden)
    }
    /// `Target::embed`.
    fn embed_tokens(&self, tokens: &Array) -> Result<Array, SpecError>;
    /// `Target::weights_bytes`.
    fn held_bytes(&self) -> usize;
}

/// One request's tokens through the packed forward as a single row of
/// `form`.
pub(crate) fn forward_one(
    model: &impl PackedForward,
    tokens: &Array,
    caches: &mut CacheSet,
    taps: &[usize],
    form: RowForm,
) -> Result<TargetOutput, SpecError> {
    let mut packed = Packed::single(tokens, caches, form)?;
    let (hidden, taps) = model.run_packed(&mut packed, taps)?;
    Ok(TargetOutput { hidden, taps })
}

/// `impl Target for $model` from its [`Family`] implementation.
macro_rules! family_target {
    ($model:ty) => {
        impl spec_core::Target for $model {
            fn info(&self) -> &spec_core::TargetInfo {
                $crate::family::Family::target_info(self)
            }

            fn make_caches(&self) -> spec_core::CacheSet {
                $crate::family::Family::fresh_caches(self)
            }

            fn forward(
                &self,
                tokens: &mlx_rs::Array,
                caches: &mut spec_core::CacheSet,
                taps: &[usize],
            ) -> Result<spec_core::TargetOutput, spec_core::SpecError> {
                $crate::family::forward_one(self, tokens, caches, taps, spec_core::RowForm::Prefill)
            }

            fn decode(
                &self,
                tokens: &mlx_rs::Array,
                caches: &mut spec_core::CacheSet,
                taps: &[usize],
            ) -> Result<spec_core::TargetOutput, spec_core::SpecError> {
                let form = <$model as $crate::family::Family>::DECODE_FORM;
                $crate::family::forward_one(self, tokens, caches, taps, form)
            }

            /// One forward over the packed rows: prefill rows as `forward`
            /// computes them, decoding rows as `decode` does. Validation
            /// errors leave every cache untouched; an error while building
            /// the graph may leave rows' caches advanced.
            fn forward_batch(
                &self,
                rows: &mut [spec_core::BatchRow<'_>],
                taps: &[usize],
            ) -> Result<spec_core::BatchOutput, spec_core::SpecError> {
                $crate::batch::forward_batch(self, rows, taps)
            }

            /// The packed forward over lazy ids (pipelined decoding).
            fn decode_rows(
                &self,
                ids: &mlx_rs::Array,
                caches: &mut [&mut spec_core::CacheSet],
            ) -> Result<spec_core::BatchOutput, spec_core::SpecError> {
                $crate::batch::decode_rows(self, ids, caches)
            }

            fn logits(
                &self,
                hidden: &mlx_rs::Array,
            ) -> Result<mlx_rs::Array, spec_core::SpecError> {
                $crate::family::Family::head_logits(self, hidden)
            }

            fn logits_before_softcap(
                &self,
                hidden: &mlx_rs::Array,
            ) -> Result<mlx_rs::Array, spec_core::SpecError> {
                $crate::family::Family::head_logits_before_softcap(self, hidden)
            }

            fn embed(&self, tokens: &mlx_rs::Array) -> Result<mlx_rs::Array, spec_core::SpecError> {
                $crate::family::Family::embed_tokens(self, tokens)
            }

            fn weights_bytes(&self) -> usize {
                $crate::family::Family::held_bytes(self)
            }

            fn as_any(&self) -> &dyn std::any::Any {
                self
            }

            fn split_invariant(&self) -> bool {
                $crate::family::Family::split_invariant(self)
            }
        }
    };
}
pub(crate) use family_target;

/// What a family's model provides for a pipeline `Stage`.
pub(crate) trait StageFamily: Family + Target + Send + std::fmt::Debug {
    /// The rank's place (`None`: the whole model).
    fn stage_slice(&self) -> Option<PipelineSlice>;
    /// The decoder layers held (global indices).
    fn held_layers(&self) -> Range<usize>;
    /// The decoder layers rank `rank` of a pipeline of `size` holds.
    fn layers_of_rank(&self, rank: usize, size: usize) -> Result<Range<usize>, ModelError>;
    /// Checks packed rows against the held layers' caches.
    fn check_stage(&self, packed: &Packed<'_>) -> Result<(), SpecError>;
    /// The held layers over packed rows from `h`: the last layer's output
    /// and the outputs of the held layers listed in `taps` (global
    /// indices).
    fn run_held(
        &self,
        h: Array,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError>;
    /// The final norm (held by rank 0 only).
    fn final_norm(&self) -> Option<&RmsNorm>;
    /// The error of a forward this slice cannot run alone.
    fn partial(&self) -> SpecError;
}

impl<M: StageFamily> Stage for M {
    fn slice(&self) -> PipelineSlice {
        self.stage_slice().unwrap_or(PipelineSlice::SINGLE)
    }

    fn layer_range(&self) -> Range<usize> {
        self.held_layers()
    }

    fn rank_layers(&self, rank: usize) -> Result<Range<usize>, ModelError> {
        self.layers_of_rank(rank, Stage::slice(self).size())
    }

    fn stage_caches(&self) -> CacheSet {
        self.fresh_caches()
    }

    fn hidden_dtype(&self) -> Result<Dtype, SpecError> {
        Ok(self
            .embed_tokens(&Array::from_slice(&[0u32], &[1, 1]))?
            .dtype())
    }

    fn run_stage(
        &self,
        input: Option<&Array>,
        rows: &mut [BatchRow<'_>],
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        let mut packed = Packed::batch(rows)?;
        self.check_stage(&packed)?;
        let h = match input {
            Some(h) => h.clone(),
            None => self.embed_tokens(&packed.ids)?,
        };
        self.run_held(h, &mut packed, taps)
    }

    fn finish(&self, h: &Array) -> Result<Array, SpecError> {
        match self.final_norm() {
            Some(norm) => Ok(norm.forward(h)?),
            None => Err(self.partial()),
        }
    }

    fn target(&self) -> &(dyn Target + Send) {
        self
    }
}
