//! The feed-forward blocks of `glm_moe_dsa`: the dense SwiGLU MLP and the
//! mixture of experts (sigmoid router with `e_score_correction_bias`,
//! group-limited top-k, `routed_scaling_factor`, optional renormalisation,
//! shared experts), in mlx-lm's `deepseek_v32` / `SwitchGLU` op order.

use std::sync::Arc;

use mlx_rs::ops::indexing::{topk_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, sigmoid, unflatten};
use mlx_rs::{Array, Dtype};

use super::config::{Config, MoeConfig};
use crate::layers::{Activation, GatedMlp};
use crate::switch_glu::{Started, SwitchGlu};
use crate::weights::WeightsView;
use crate::{DtypePolicy, ModelError};
use spec_runtime::experts::ExpertStore;

/// GLM's dense MLP (and each shared expert): SwiGLU without biases.
pub(super) fn mlp(vb: &WeightsView<'_>, hidden: i32, width: i32) -> Result<GatedMlp, ModelError> {
    GatedMlp::load(vb, hidden, width, false, Activation::Silu)
}

/// Where a layer's routed experts come from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Experts<'a> {
    /// Loaded whole, as stored (the dtype policy applies).
    Resident,
    /// Left on disk, read through this store's tier.
    Streamed(&'a Arc<ExpertStore>),
    /// Loaded whole at 8 bits (the MTP row's tier; errors name the option).
    EightBit(&'static str),
}

/// Routed experts plus shared experts.
#[derive(Debug)]
pub(super) struct Moe {
    router: Array,
    correction_bias: Array,
    experts: SwitchGlu,
    shared: Option<GatedMlp>,
    config: MoeConfig,
}

impl Moe {
    /// `experts`: where the routed experts come from.
    pub fn load(
        vb: &WeightsView<'_>,
        c: &Config,
        m: &MoeConfig,
        experts: Experts<'_>,
    ) -> Result<Self, ModelError> {
        let router = vb.take_shaped("gate.weight", &[m.experts, c.hidden])?;
        let router = if vb.policy() == DtypePolicy::Float32 {
            router.as_dtype(Dtype::Float32)?
        } else {
            router
        };
        // mlx-lm never casts the correction bias (its `cast_predicate`).
        let correction_bias = vb.take_shaped("gate.e_score_correction_bias", &[m.experts])?;
        let (n, h, i) = (m.experts, c.hidden, m.intermediate);
        Ok(Self {
            router,
            correction_bias,
            experts: match experts {
                Experts::Streamed(store) => {
                    SwitchGlu::streamed(store, vb, "switch_mlp", n, i, h, Activation::Silu)?
                }
                Experts::Resident => {
                    SwitchGlu::load(&vb.pp("switch_mlp"), n, i, h, Activation::Silu)?
                }
                Experts::EightBit(option) => {
                    SwitchGlu::load_8bit(&vb.pp("switch_mlp"), n, i, h, Activation::Silu, option)?
                }
            },
            shared: match m.shared {
                Some(s) => Some(mlp(&vb.pp("shared_experts"), h, i * s)?),
                None => None,
            },
            config: m.clone(),
        })
    }

    /// Bits of the routed experts when resident and quantized.
    pub fn expert_bits(&self) -> Option<i32> {
        self.experts.bits()
    }

    /// Bytes the routed experts hold (streamed: none).
    pub fn expert_nbytes(&self) -> usize {
        self.experts.nbytes()
    }

    pub fn nbytes(&self) -> usize {
        self.router.nbytes()
            + self.correction_bias.nbytes()
            + self.experts.nbytes()
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

    /// Whether a forward of `tokens` tokens regroups them by expert
    /// (`rows_alone` never does).
    pub fn regroups(&self, tokens: usize, rows_alone: bool) -> bool {
        !rows_alone && SwitchGlu::sorts(tokens * self.config.top_k as usize)
    }

    /// `rows_alone`: never regroup the rows by expert (a single row never
    /// is; the grouped kernels would round a row differently).
    pub fn forward(&self, x: &Array, rows_alone: bool) -> Result<Array, ModelError> {
        let (inds, weights) = self.route(x)?;
        let started = self.experts.start(&inds)?;
        // While streamed experts are read, the shared expert computes.
        let shared = match &self.shared {
            Some(shared) => Some(shared.forward(x)?),
            None => None,
        };
        if let (Some(shared), Started::Streamed(..)) = (&shared, &started) {
            mlx_rs::transforms::async_eval([shared])?;
        }
        let y = self.experts.finish(x, started, !rows_alone)?;
        let dtype = y.dtype();
        let y = y
            .multiply(weights.expand_dims(-1)?)?
            .sum_axis(-2, false)?
            .as_dtype(dtype)?;
        match shared {
            Some(shared) => Ok(y.add(shared)?),
            None => Ok(y),
        }
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub(super) enum FeedForward {
    Dense(Box<GatedMlp>),
    Moe(Box<Moe>),
}

impl FeedForward {
    pub fn nbytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.nbytes(),
            FeedForward::Moe(m) => m.nbytes(),
        }
    }
}
