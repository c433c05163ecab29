//! Gemma-4's mixture-of-experts block (the 26B-A4B layout), as mlx-lm's
//! `Router`, `Experts` and `SwitchGLU` compute it: a router over normalised
//! hidden states picks `top_k` experts per token, each a GeGLU MLP run through
//! `gather_mm` (tokens sorted by expert once there are 64 or more picks).

use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, softmax_axis};
use mlx_rs::Array;
use spec_runtime::experts::ExpertStore;
use std::sync::Arc;

use crate::layers::{Activation, Linear, RmsNorm};
use crate::switch_glu::{Started, SwitchGlu};
use crate::weights::WeightsView;
use crate::ModelError;

/// The router, the experts and the block's three extra norms.
#[derive(Debug)]
pub(crate) struct MoeBlock {
    proj: Linear,
    /// `scale * hidden^-0.5`, the router norm's weight.
    norm_weight: Array,
    per_expert_scale: Array,
    experts: SwitchGlu,
    top_k: i32,
    eps: f32,
    pub(crate) post_ff_norm_1: RmsNorm,
    pub(crate) pre_ff_norm_2: RmsNorm,
    pub(crate) post_ff_norm_2: RmsNorm,
}

/// Sizes of the block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoeDims {
    pub hidden: i32,
    pub experts: i32,
    pub top_k: i32,
    pub intermediate: i32,
    pub eps: f32,
}

impl MoeBlock {
    /// Loads the block of the layer `vb` reads (`...layers.{i}`); with
    /// `store`, its routed experts stay on disk (mlx-lm's
    /// `experts.switch_glu.*` or Hugging Face's fused `experts.*`) and
    /// stream through the store's tier.
    pub(crate) fn load(
        vb: &WeightsView<'_>,
        d: MoeDims,
        store: Option<&Arc<ExpertStore>>,
    ) -> Result<Self, ModelError> {
        let scale = vb.take_cast("router.scale", &[d.hidden])?;
        let norm_weight = scale.multiply(Array::from_f32(f64::from(d.hidden).powf(-0.5) as f32))?;
        norm_weight.eval()?;
        let e = vb.pp("experts.switch_glu");
        let norm = |name: &str| RmsNorm::load(&vb.pp(name), d.hidden, d.eps);
        Ok(Self {
            proj: Linear::load(&vb.pp("router.proj"), d.hidden, d.experts, false)?,
            norm_weight,
            per_expert_scale: vb.take_cast("router.per_expert_scale", &[d.experts])?,
            experts: match store {
                Some(store) => SwitchGlu::streamed(
                    store,
                    vb,
                    "experts.switch_glu",
                    d.experts,
                    d.intermediate,
                    d.hidden,
                    Activation::GeluApprox,
                )?,
                None => SwitchGlu::load(
                    &e,
                    d.experts,
                    d.intermediate,
                    d.hidden,
                    Activation::GeluApprox,
                )?,
            },
            top_k: d.top_k,
            eps: d.eps,
            post_ff_norm_1: norm("post_feedforward_layernorm_1")?,
            pre_ff_norm_2: norm("pre_feedforward_layernorm_2")?,
            post_ff_norm_2: norm("post_feedforward_layernorm_2")?,
        })
    }

    /// Expert picks and their weights for `h` (`[B, L, hidden]`).
    fn route(&self, h: &Array) -> Result<(Array, Array), ModelError> {
        let x = mlx_rs::fast::rms_norm(h, Some(&self.norm_weight), self.eps)?;
        let scores = self.proj.forward(&x)?;
        let picks = argpartition_axis(&scores, -self.top_k, -1)?.index((.., .., -self.top_k..));
        let weights = softmax_axis(take_along_axis(&scores, &picks, -1)?, -1, None)?;
        let weights = weights.multiply(self.per_expert_scale.take_axis(&picks, 0)?)?;
        Ok((picks, weights))
    }

    /// Whether a forward of `tokens` tokens regroups them by expert (a form
    /// that rounds a token differently from the ungrouped one).
    pub(crate) fn regroups(&self, tokens: usize) -> bool {
        SwitchGlu::sorts(tokens * self.top_k as usize)
    }

    /// The experts' mixture for `x` (the pre-normed input, `[B, L, hidden]`),
    /// routed on `h` (the block input). `may_regroup`: take mlx-lm's
    /// grouped form once there are enough picks, as a forward of exactly
    /// these tokens does; false keeps every token ungrouped (packed rows of
    /// several requests, each of which would not regroup alone). `overlap`:
    /// work dispatched while streamed experts are read (the layer's dense
    /// MLP).
    pub(crate) fn forward(
        &self,
        h: &Array,
        x: &Array,
        may_regroup: bool,
        overlap: &[&Array],
    ) -> Result<Array, ModelError> {
        let (picks, weights) = self.route(h)?;
        let started = self.experts.start(&picks)?;
        if matches!(started, Started::Streamed(..)) && !overlap.is_empty() {
            mlx_rs::transforms::async_eval(overlap.iter().copied())?;
        }
        let y = self.experts.finish(x, started, may_regroup)?;
        Ok(weights.expand_dims(-1)?.multiply(&y)?.sum_axis(-2, None)?)
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.proj.nbytes()
            + self.norm_weight.nbytes()
            + self.per_expert_scale.nbytes()
            + self.experts.nbytes()
            + self.post_ff_norm_1.nbytes()
            + self.pre_ff_norm_2.nbytes()
            + self.post_ff_norm_2.nbytes()
    }
}
