//! The feed-forward blocks of `glm_moe_dsa`: the dense SwiGLU MLP and the
//! mixture of experts (sigmoid router with `e_score_correction_bias`,
//! group-limited top-k, `routed_scaling_factor`, optional renormalisation,
//! shared experts), in mlx-lm's `deepseek_v32` / `SwitchGLU` op order.

use mlx_rs::ops::indexing::{topk_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, argsort_axis, sigmoid, unflatten};
use mlx_rs::{Array, Dtype};

use super::config::{Config, MoeConfig};
use crate::layers::{swiglu, Activation, GatedMlp};
use crate::stacked::Stacked;
use crate::weights::WeightsView;
use crate::{DtypePolicy, ModelError};

/// mlx-lm sorts tokens by expert once this many (token, expert) pairs route.
const SORT_THRESHOLD: usize = 64;

/// GLM's dense MLP (and each shared expert): SwiGLU without biases.
pub(super) fn mlp(vb: &WeightsView<'_>, hidden: i32, width: i32) -> Result<GatedMlp, ModelError> {
    GatedMlp::load(vb, hidden, width, false, Activation::Silu)
}

/// Routed experts plus shared experts.
#[derive(Debug)]
pub(super) struct Moe {
    router: Array,
    correction_bias: Array,
    gate_proj: Stacked,
    up_proj: Stacked,
    down_proj: Stacked,
    shared: Option<GatedMlp>,
    config: MoeConfig,
}

impl Moe {
    pub fn load(vb: &WeightsView<'_>, c: &Config, m: &MoeConfig) -> Result<Self, ModelError> {
        let router = vb.take_shaped("gate.weight", &[m.experts, c.hidden])?;
        let router = if vb.policy() == DtypePolicy::Float32 {
            router.as_dtype(Dtype::Float32)?
        } else {
            router
        };
        // mlx-lm never casts the correction bias (its `cast_predicate`).
        let correction_bias = vb.take_shaped("gate.e_score_correction_bias", &[m.experts])?;
        let sp = vb.pp("switch_mlp");
        let (n, h, i) = (m.experts, c.hidden, m.intermediate);
        Ok(Self {
            router,
            correction_bias,
            gate_proj: Stacked::load(&sp.pp("gate_proj"), n, i, h)?,
            up_proj: Stacked::load(&sp.pp("up_proj"), n, i, h)?,
            down_proj: Stacked::load(&sp.pp("down_proj"), n, h, i)?,
            shared: match m.shared {
                Some(s) => Some(mlp(&vb.pp("shared_experts"), h, i * s)?),
                None => None,
            },
            config: m.clone(),
        })
    }

    pub fn nbytes(&self) -> usize {
        self.router.nbytes()
            + self.correction_bias.nbytes()
            + self.gate_proj.nbytes()
            + self.up_proj.nbytes()
            + self.down_proj.nbytes()
            + self.shared.as_ref().map_or(0, GatedMlp::nbytes)
    }

    /// mlx-lm's `group_expert_select`: expert indices `[.., top_k]` and their
    /// weights (float32).
    fn route(&self, x: &Array) -> Result<(Array, Array), ModelError> {
        let m = &self.config;
        let gates = x.matmul(self.router.t())?;
        let scores = sigmoid(gates.as_dtype(Dtype::Float32)?)?;
        let mut biased = scores.add(&self.correction_bias)?;
        if m.n_group > 1 {
            let grouped = unflatten(&biased, -1, &[m.n_group, -1])?;
            let group_scores = topk_axis(&grouped, 2, -1)?.sum_axis(-1, true)?;
            let drop = m.n_group - m.topk_group;
            let grouped = if drop > 0 {
                let worst =
                    argpartition_axis(&group_scores, drop - 1, -2)?.index((.., .., ..drop, ..));
                grouped.put_along_axis(&worst, Array::from_f32(0.0), -2)?
            } else {
                grouped
            };
            biased = grouped.flatten(-2, -1)?;
        }
        let k = m.top_k;
        let inds = argpartition_axis(biased.negative()?, k - 1, -1)?.index((.., .., ..k));
        let mut weights = scores.take_along_axis(&inds, -1)?;
        if k > 1 && m.norm_topk_prob {
            let total = weights.sum_axis(-1, true)?;
            weights = weights.divide(&total)?;
        }
        Ok((inds, weights.multiply(Array::from_f32(m.routed_scaling))?))
    }

    /// `SwitchGLU`: each token through its experts, `[B, L, top_k, H]`.
    fn experts(&self, x: &Array, inds: &Array, rows_alone: bool) -> Result<Array, ModelError> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        let glu = |x: &Array, idx: &Array, sorted: bool| -> Result<Array, ModelError> {
            let up = self.up_proj.gather(x, idx, sorted)?;
            let gate = self.gate_proj.gather(x, idx, sorted)?;
            self.down_proj.gather(&swiglu(&gate, &up)?, idx, sorted)
        };
        let out = if inds.size() >= SORT_THRESHOLD && !rows_alone {
            let per_token = *inds.shape().last().unwrap_or(&1);
            let flat = inds.flatten(None, None)?;
            let order = argsort_axis(&flat, -1)?;
            let inverse = argsort_axis(&order, -1)?;
            let rows = x
                .flatten(0, -3)?
                .take_axis(order.floor_divide(Array::from_int(per_token))?, 0)?;
            let y = glu(&rows, &flat.take_axis(&order, 0)?, true)?;
            unflatten(y.take_axis(&inverse, 0)?, 0, inds.shape())?
        } else {
            glu(&x, inds, false)?
        };
        Ok(out.squeeze_axes(&[-2])?)
    }

    /// Whether a forward of `tokens` tokens regroups them by expert
    /// (`rows_alone` never does).
    pub fn regroups(&self, tokens: usize, rows_alone: bool) -> bool {
        !rows_alone && tokens * self.config.top_k as usize >= SORT_THRESHOLD
    }

    /// `rows_alone`: never regroup the rows by expert (a single row never
    /// is; the grouped kernels would round a row differently).
    pub fn forward(&self, x: &Array, rows_alone: bool) -> Result<Array, ModelError> {
        let (inds, weights) = self.route(x)?;
        let y = self.experts(x, &inds, rows_alone)?;
        let dtype = y.dtype();
        let y = y
            .multiply(weights.expand_dims(-1)?)?
            .sum_axis(-2, false)?
            .as_dtype(dtype)?;
        match &self.shared {
            Some(shared) => Ok(y.add(shared.forward(x)?)?),
            None => Ok(y),
        }
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub(super) enum FeedForward {
    Dense(GatedMlp),
    Moe(Moe),
}

impl FeedForward {
    pub fn nbytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.nbytes(),
            FeedForward::Moe(m) => m.nbytes(),
        }
    }
}
