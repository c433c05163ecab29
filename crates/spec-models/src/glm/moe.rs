//! The feed-forward blocks of `glm_moe_dsa`: the dense SwiGLU MLP and the
//! mixture of experts (sigmoid router with `e_score_correction_bias`,
//! group-limited top-k, `routed_scaling_factor`, optional renormalisation,
//! shared experts), in mlx-lm's `deepseek_v32` / `SwitchGLU` op order.

use mlx_rs::ops::indexing::{topk_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, argsort_axis, sigmoid, unflatten};
use mlx_rs::{Array, Dtype};

use super::config::{Config, MoeConfig};
use super::stacked::Stacked;
use crate::layers::{swiglu, Linear};
use crate::weights::Weights;
use crate::{DtypePolicy, ModelError};

/// mlx-lm sorts tokens by expert once this many (token, expert) pairs route.
const SORT_THRESHOLD: usize = 64;

/// `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub(super) struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    pub fn load(
        w: &mut Weights,
        p: &str,
        c: &Config,
        width: i32,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        let q = &c.quantization;
        Ok(Self {
            gate: Linear::load(
                w,
                &format!("{p}.gate_proj"),
                c.hidden,
                width,
                false,
                q,
                policy,
            )?,
            up: Linear::load(
                w,
                &format!("{p}.up_proj"),
                c.hidden,
                width,
                false,
                q,
                policy,
            )?,
            down: Linear::load(
                w,
                &format!("{p}.down_proj"),
                width,
                c.hidden,
                false,
                q,
                policy,
            )?,
        })
    }

    pub fn nbytes(&self) -> usize {
        self.gate.nbytes() + self.up.nbytes() + self.down.nbytes()
    }

    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        self.down
            .forward(&swiglu(&self.gate.forward(x)?, &self.up.forward(x)?)?)
    }
}

/// Routed experts plus shared experts.
#[derive(Debug)]
pub(super) struct Moe {
    router: Array,
    correction_bias: Array,
    gate_proj: Stacked,
    up_proj: Stacked,
    down_proj: Stacked,
    shared: Option<Mlp>,
    config: MoeConfig,
}

impl Moe {
    pub fn load(
        w: &mut Weights,
        p: &str,
        c: &Config,
        m: &MoeConfig,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        let q = &c.quantization;
        let router = w.take_shaped(&format!("{p}.gate.weight"), &[m.experts, c.hidden])?;
        let router = if policy == DtypePolicy::Float32 {
            router.as_dtype(Dtype::Float32)?
        } else {
            router
        };
        // mlx-lm never casts the correction bias (its `cast_predicate`).
        let correction_bias =
            w.take_shaped(&format!("{p}.gate.e_score_correction_bias"), &[m.experts])?;
        let sp = format!("{p}.switch_mlp");
        Ok(Self {
            router,
            correction_bias,
            gate_proj: Stacked::load(
                w,
                &format!("{sp}.gate_proj"),
                m.experts,
                m.intermediate,
                c.hidden,
                q,
                policy,
            )?,
            up_proj: Stacked::load(
                w,
                &format!("{sp}.up_proj"),
                m.experts,
                m.intermediate,
                c.hidden,
                q,
                policy,
            )?,
            down_proj: Stacked::load(
                w,
                &format!("{sp}.down_proj"),
                m.experts,
                c.hidden,
                m.intermediate,
                q,
                policy,
            )?,
            shared: match m.shared {
                Some(n) => Some(Mlp::load(
                    w,
                    &format!("{p}.shared_experts"),
                    c,
                    m.intermediate * n,
                    policy,
                )?),
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
            + self.shared.as_ref().map_or(0, Mlp::nbytes)
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
    Dense(Mlp),
    Moe(Moe),
}

impl FeedForward {
    pub fn nbytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.nbytes(),
            FeedForward::Moe(m) => m.nbytes(),
        }
    }

    pub fn forward(&self, x: &Array, rows_alone: bool) -> Result<Array, ModelError> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => m.forward(x, rows_alone),
        }
    }
}
