//! The sparse feed-forward block of `qwen3_next` and `qwen3_5_moe`
//! (mlx-lm's `Qwen3NextSparseMoeBlock`): a softmax router (accumulated in
//! float32), the `top_k` largest probabilities by `argpartition` (in
//! mlx-lm's order, which the weighted sum follows), optionally renormalised,
//! the routed experts (`SwitchGLU`), and a shared expert scaled by a
//! sigmoid gate.

use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, sigmoid, softmax_axis};
use mlx_rs::Array;
use spec_runtime::experts::ExpertStore;
use std::sync::Arc;

use super::config::MoeConfig;
use crate::layers::{Activation, GatedMlp, Linear};
use crate::switch_glu::{Started, SwitchGlu};
use crate::weights::WeightsView;
use crate::ModelError;

/// Routed experts plus the gated shared expert.
#[derive(Debug)]
pub(super) struct SparseMoe {
    router: Linear,
    experts: SwitchGlu,
    shared: GatedMlp,
    shared_gate: Linear,
    config: MoeConfig,
}

impl SparseMoe {
    /// Loads the block under `vb` (`...layers.{i}.mlp`, switch layout; or,
    /// with `store`, its routed experts left on disk in either layout and
    /// streamed through the store's tier).
    pub fn load(
        vb: &WeightsView<'_>,
        m: MoeConfig,
        hidden: i32,
        store: Option<&Arc<ExpertStore>>,
    ) -> Result<Self, ModelError> {
        let (n, i, silu) = (m.experts, m.intermediate, Activation::Silu);
        let experts = match store {
            Some(store) => SwitchGlu::streamed(store, vb, "switch_mlp", n, i, hidden, silu)?,
            None => SwitchGlu::load(&vb.pp("switch_mlp"), n, i, hidden, silu)?,
        };
        Ok(Self {
            router: Linear::load(&vb.pp("gate"), hidden, m.experts, false)?,
            experts,
            shared: GatedMlp::load(
                &vb.pp("shared_expert"),
                hidden,
                m.shared_intermediate,
                false,
                Activation::Silu,
            )?,
            shared_gate: Linear::load(&vb.pp("shared_expert_gate"), hidden, 1, false)?,
            config: m,
        })
    }

    pub fn nbytes(&self) -> usize {
        self.router.nbytes()
            + self.experts.nbytes()
            + self.shared.nbytes()
            + self.shared_gate.nbytes()
    }

    /// Whether a forward of `tokens` tokens (allowed to) takes the sorted
    /// expert form.
    pub fn sorts(&self, tokens: usize) -> bool {
        SwitchGlu::sorts(tokens * self.config.top_k as usize)
    }

    /// The block over `x` (`[B, L, hidden]`). `may_sort`: mlx-lm's form for
    /// exactly these tokens (sorted by expert past 64 picks); `false` keeps
    /// each token's own unsorted form (decoding rows, whose bits must not
    /// depend on the window).
    pub fn forward(&self, x: &Array, may_sort: bool) -> Result<Array, ModelError> {
        let m = &self.config;
        let probs = softmax_axis(self.router.forward(x)?, -1, true)?;
        let k = m.top_k;
        let picks = argpartition_axis(&probs, m.experts - k, -1)?.index((.., .., m.experts - k..));
        let mut scores = take_along_axis(&probs, &picks, -1)?;
        if m.norm_topk_prob {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        let started = self.experts.start(&picks)?;
        // While streamed experts are read, the shared expert computes.
        let shared = sigmoid(self.shared_gate.forward(x)?)?.multiply(self.shared.forward(x)?)?;
        if let Started::Streamed(..) = &started {
            mlx_rs::transforms::async_eval([&shared])?;
        }
        let y = self.experts.finish(x, started, may_sort)?;
        let y = y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?;
        Ok(y.add(shared)?)
    }
}
