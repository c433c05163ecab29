//! The sparse feed-forward blocks of the Qwen MoE families and gpt-oss.
//! The Qwen block, as mlx-lm's `Qwen3MoeSparseMoeBlock` (`qwen3_moe`) and
//! `Qwen3NextSparseMoeBlock` (`qwen3_next`, `qwen3_5_moe`) define it: a
//! softmax router (accumulated in float32), the `top_k` largest
//! probabilities by `argpartition` (in mlx-lm's order, which the weighted
//! sum follows), optionally renormalised, the routed experts (`SwitchGLU`),
//! and in the Next / 3.5 block a shared expert scaled by a sigmoid gate.
//! gpt-oss's (`MLPBlock`): a router with a bias, the `top_k` largest
//! logits, a softmax over them, experts with biases and the clamped
//! SwiGLU. Also the layer choice the Qwen configs make
//! (`decoder_sparse_step`, `mlp_only_layers`) and [`FeedForward`], a
//! layer's dense or expert block over packed rows.

use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, sigmoid, softmax_axis};
use mlx_rs::Array;
use spec_core::RowForm;
use spec_runtime::experts::ExpertStore;
use std::sync::Arc;

use crate::batch::Packed;
use crate::layers::{Activation, GatedMlp, Linear};
use crate::switch_glu::{per_expert_names, stacked_name, Started, SwitchGlu, PROJECTIONS};
use crate::weights::{Weights, WeightsView};
use crate::ModelError;

/// A sparse block's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// `num_experts`.
    pub experts: i32,
    /// `num_experts_per_tok`.
    pub top_k: i32,
    /// `moe_intermediate_size`: each routed expert's width.
    pub intermediate: i32,
    /// `shared_expert_intermediate_size` (`None`: no shared expert, as
    /// `qwen3_moe`).
    pub shared_intermediate: Option<i32>,
    /// `norm_topk_prob`: the picked probabilities renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Whose block it is.
    pub flavor: MoeFlavor,
}

/// Whose block: the module names, the routing and the activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeFlavor {
    /// The Qwen block: `gate` (no bias) and `switch_mlp`, softmax then
    /// top-k, SwiGLU.
    Qwen,
    /// gpt-oss's: `router` (with a bias) and `experts` (with biases), top-k
    /// then softmax, the clamped SwiGLU.
    GptOss,
}

impl MoeFlavor {
    /// The router's and the stacked experts' module names.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            MoeFlavor::Qwen => ("gate", "switch_mlp"),
            MoeFlavor::GptOss => ("router", "experts"),
        }
    }
}

/// The config keys that say which layers are expert blocks and how large.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoeKeys<'a> {
    pub num_experts: usize,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: &'a [usize],
    pub moe_intermediate_size: i32,
    /// `None` where the family has no shared expert.
    pub shared_expert_intermediate_size: Option<i32>,
    pub norm_topk_prob: bool,
}

impl MoeKeys<'_> {
    /// Per layer of `layers`, whether it is an expert block, as mlx-lm
    /// decides: experts exist, the layer is not MLP-only, and `i + 1` is a
    /// multiple of `decoder_sparse_step`. Errors name the key.
    pub fn sparse_layers(&self, layers: usize) -> Result<Vec<bool>, String> {
        if let Some(i) = self.mlp_only_layers.iter().find(|&&i| i >= layers) {
            return Err(format!(
                "mlp_only_layers names layer {i} of {layers} layers"
            ));
        }
        if self.num_experts > 0 && self.decoder_sparse_step == 0 {
            return Err(
                "decoder_sparse_step must be positive (every n-th layer is an expert block)".into(),
            );
        }
        Ok((0..layers)
            .map(|i| {
                !self.mlp_only_layers.contains(&i)
                    && self.num_experts > 0
                    && (i + 1) % self.decoder_sparse_step == 0
            })
            .collect())
    }

    /// The block's sizes where some layer is sparse (`None` where none
    /// is), checked. Errors name the key.
    pub fn config(&self, sparse: &[bool]) -> Result<Option<MoeConfig>, String> {
        if !sparse.contains(&true) {
            return Ok(None);
        }
        let experts = i32::try_from(self.num_experts)
            .map_err(|_| format!("num_experts {} is too large", self.num_experts))?;
        if !(1..=experts).contains(&self.num_experts_per_tok) {
            return Err(format!(
                "num_experts_per_tok must lie in 1..={experts} (num_experts), got {}",
                self.num_experts_per_tok
            ));
        }
        let shared = self
            .shared_expert_intermediate_size
            .map(|v| ("shared_expert_intermediate_size", v));
        for (name, v) in
            std::iter::once(("moe_intermediate_size", self.moe_intermediate_size)).chain(shared)
        {
            if v <= 0 {
                return Err(format!(
                    "{name} must be positive in a model with expert blocks, got {v}"
                ));
            }
        }
        Ok(Some(MoeConfig {
            experts,
            top_k: self.num_experts_per_tok,
            intermediate: self.moe_intermediate_size,
            shared_intermediate: self.shared_expert_intermediate_size,
            norm_topk_prob: self.norm_topk_prob,
            flavor: MoeFlavor::Qwen,
        }))
    }
}

/// The gated shared expert of the Next / 3.5 block.
#[derive(Debug)]
struct SharedExpert {
    mlp: GatedMlp,
    gate: Linear,
}

/// Routed experts, plus the gated shared expert where the block has one.
#[derive(Debug)]
pub(crate) struct SparseMoe {
    router: Linear,
    experts: SwitchGlu,
    shared: Option<SharedExpert>,
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
        let (router, stacked) = m.flavor.names();
        let act = match m.flavor {
            MoeFlavor::Qwen => silu,
            MoeFlavor::GptOss => Activation::SwigluOai,
        };
        let experts = match store {
            Some(store) => SwitchGlu::streamed(store, vb, stacked, n, i, hidden, act)?,
            None => SwitchGlu::load(&vb.pp(stacked), n, i, hidden, act)?,
        };
        let shared = match m.shared_intermediate {
            Some(width) => Some(SharedExpert {
                mlp: GatedMlp::load(&vb.pp("shared_expert"), hidden, width, false, silu)?,
                gate: Linear::load(&vb.pp("shared_expert_gate"), hidden, 1, false)?,
            }),
            None => None,
        };
        Ok(Self {
            router: Linear::load(
                &vb.pp(router),
                hidden,
                m.experts,
                m.flavor == MoeFlavor::GptOss,
            )?,
            experts,
            shared,
            config: m,
        })
    }

    pub fn nbytes(&self) -> usize {
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |s| s.mlp.nbytes() + s.gate.nbytes());
        self.router.nbytes() + self.experts.nbytes() + shared
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
        let logits = self.router.forward(x)?;
        let k = m.top_k;
        let top = |a: &Array| -> Result<Array, ModelError> {
            Ok(argpartition_axis(a, m.experts - k, -1)?.index((.., .., m.experts - k..)))
        };
        let (picks, scores) = match m.flavor {
            MoeFlavor::Qwen => {
                let probs = softmax_axis(logits, -1, true)?;
                let picks = top(&probs)?;
                let mut scores = take_along_axis(&probs, &picks, -1)?;
                if m.norm_topk_prob {
                    scores = scores.divide(scores.sum_axis(-1, true)?)?;
                }
                (picks, scores)
            }
            MoeFlavor::GptOss => {
                let picks = top(&logits)?;
                let picked = take_along_axis(&logits, &picks, -1)?;
                (picks, softmax_axis(picked, -1, true)?)
            }
        };
        let started = self.experts.start(&picks)?;
        // While streamed experts are read, the shared expert computes.
        let shared = match &self.shared {
            Some(s) => {
                let shared = sigmoid(s.gate.forward(x)?)?.multiply(s.mlp.forward(x)?)?;
                if let Started::Streamed(..) = &started {
                    mlx_rs::transforms::async_eval([&shared])?;
                }
                Some(shared)
            }
            None => None,
        };
        let y = self.experts.finish(x, started, may_sort)?;
        let dtype = y.dtype();
        let y = y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?;
        // mlx-lm's `qwen3_moe` block casts the weighted sum back to the
        // experts' dtype; the Next block adds its shared expert instead,
        // and gpt-oss's does neither.
        Ok(match (shared, m.flavor) {
            (Some(shared), _) => y.add(shared)?,
            (None, MoeFlavor::Qwen) => y.as_dtype(dtype)?,
            (None, MoeFlavor::GptOss) => y,
        })
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub(crate) enum FeedForward {
    Dense(Box<GatedMlp>),
    Sparse(Box<SparseMoe>),
}

impl FeedForward {
    /// The dense SwiGLU MLP or the expert block of a layer under `vb`
    /// (`...layers.{i}.mlp`), as `sparse` says.
    /// `bias`: the dense MLP's biases.
    pub fn load(
        vb: &WeightsView<'_>,
        sparse: Option<MoeConfig>,
        hidden: i32,
        intermediate: i32,
        bias: bool,
        store: Option<&Arc<ExpertStore>>,
    ) -> Result<Self, ModelError> {
        Ok(match sparse {
            Some(m) => FeedForward::Sparse(Box::new(SparseMoe::load(vb, m, hidden, store)?)),
            None => FeedForward::Dense(Box::new(GatedMlp::load(
                vb,
                hidden,
                intermediate,
                bias,
                Activation::Silu,
            )?)),
        })
    }

    pub fn nbytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.nbytes(),
            FeedForward::Sparse(m) => m.nbytes(),
        }
    }

    /// Whether a forward of `tokens` tokens alone takes the sorted expert
    /// form.
    pub fn sorts(&self, tokens: usize) -> bool {
        match self {
            FeedForward::Sparse(m) => m.sorts(tokens),
            FeedForward::Dense(_) => false,
        }
    }

    /// The block over packed rows `x`: an expert block runs decoding rows
    /// in their own unsorted form (each row's bits as alone) and prefill
    /// chunks as mlx-lm does for exactly that chunk.
    pub fn forward(&self, x: &Array, packed: &Packed<'_>) -> Result<Array, ModelError> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => {
                let prefill = |r: usize| {
                    packed
                        .rows
                        .get(r)
                        .is_some_and(|row| row.form == RowForm::Prefill)
                };
                crate::batch::grouped(
                    &packed.spans,
                    &[x],
                    |r| !(prefill(r) && m.sorts(packed.spans[r].len())),
                    |parts, alone| m.forward(&parts[0], alone.is_some_and(prefill)),
                )
            }
        }
    }

    /// The block over one sequence `x` as mlx-lm runs exactly that chunk
    /// (the MTP head's layer).
    pub fn forward_alone(&self, x: &Array) -> Result<Array, ModelError> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x, true),
        }
    }
}

/// mlx-lm's sanitize of a Hugging Face expert block under `mlp`: the
/// per-expert projections of `experts` experts stacked into the switch
/// layout; nothing where the block is already stacked.
pub(crate) fn stack_per_expert(w: &Weights, mlp: &str, experts: i32) -> Result<(), ModelError> {
    for proj in PROJECTIONS {
        let names = per_expert_names(mlp, proj, experts);
        if !names.first().is_some_and(|n| w.contains(n)) {
            continue;
        }
        let parts = names
            .iter()
            .map(|n| w.take(n))
            .collect::<Result<Vec<_>, _>>()?;
        w.insert(stacked_name(mlp, proj), mlx_rs::ops::stack(&parts, 0)?);
    }
    Ok(())
}
