//! Gemma-4's mixture-of-experts block (the 26B-A4B layout), as mlx-lm's
//! `Router`, `Experts` and `SwitchGLU` compute it: a router over normalised
//! hidden states picks `top_k` experts per token, each a GeGLU MLP run through
//! `gather_mm` (tokens sorted by expert once there are 64 or more picks).

use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::ops::{
    argpartition_axis, argsort_axis, dequantize, floor_divide, gather_mm, gather_qmm, softmax_axis,
};
use mlx_rs::{Array, Dtype};

use super::model::gelu_approx;
use crate::config::{QuantParams, Quantization};
use crate::layers::{Linear, RmsNorm};
use crate::weights::Weights;
use crate::{DtypePolicy, ModelError};

/// mlx-lm sorts the picks by expert from this many on.
const SORT_FROM: i32 = 64;

/// The experts' weights for one projection, `[experts, out, in]`.
#[derive(Debug)]
enum SwitchKernel {
    Dense(Array),
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        params: QuantParams,
    },
}

/// mlx-lm's `SwitchLinear` / `QuantizedSwitchLinear` without bias.
#[derive(Debug)]
struct SwitchLinear {
    kernel: SwitchKernel,
}

impl SwitchLinear {
    fn load(
        w: &mut Weights,
        prefix: &str,
        experts: i32,
        in_dim: i32,
        out_dim: i32,
        quant: &Quantization,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        let name = format!("{prefix}.weight");
        if !w.contains(&format!("{prefix}.scales")) {
            let mut weight = w.take_shaped(&name, &[experts, out_dim, in_dim])?;
            if policy == DtypePolicy::Float32 && weight.dtype() != Dtype::Float32 {
                weight = weight.as_dtype(Dtype::Float32)?;
            }
            weight.eval()?;
            return Ok(Self {
                kernel: SwitchKernel::Dense(weight),
            });
        }
        let params = quant.for_module(prefix).ok_or_else(|| {
            ModelError::Spec(spec_core::SpecError::Invalid(format!("`{prefix}` is stored quantized but the quantization block has no parameters for it")))
        })?;
        let weight = w.take_shaped(&name, &[experts, out_dim, in_dim * params.bits / 32])?;
        let groups = in_dim / params.group_size;
        let scales = w.take_shaped(&format!("{prefix}.scales"), &[experts, out_dim, groups])?;
        let biases = w.take_shaped(&format!("{prefix}.biases"), &[experts, out_dim, groups])?;
        let kernel = match policy {
            DtypePolicy::Float32 => {
                let dense = dequantize(&weight, &scales, &biases, params.group_size, params.bits)?
                    .as_dtype(Dtype::Float32)?;
                dense.eval()?;
                SwitchKernel::Dense(dense)
            }
            DtypePolicy::Keep => {
                mlx_rs::transforms::eval([&weight, &scales, &biases])?;
                SwitchKernel::Quantized {
                    weight,
                    scales,
                    biases,
                    params,
                }
            }
        };
        Ok(Self { kernel })
    }

    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array, ModelError> {
        Ok(match &self.kernel {
            SwitchKernel::Dense(weight) => {
                gather_mm(x, weight.swap_axes(-1, -2)?, None, indices, sorted)?
            }
            SwitchKernel::Quantized {
                weight,
                scales,
                biases,
                params,
            } => gather_qmm(
                x,
                weight,
                scales,
                biases,
                None,
                indices,
                true,
                params.group_size,
                params.bits,
                sorted,
            )?,
        })
    }

    fn nbytes(&self) -> usize {
        match &self.kernel {
            SwitchKernel::Dense(w) => w.nbytes(),
            SwitchKernel::Quantized {
                weight,
                scales,
                biases,
                ..
            } => weight.nbytes() + scales.nbytes() + biases.nbytes(),
        }
    }
}

/// The router, the experts and the block's three extra norms.
#[derive(Debug)]
pub(crate) struct MoeBlock {
    proj: Linear,
    /// `scale * hidden^-0.5`, the router norm's weight.
    norm_weight: Array,
    per_expert_scale: Array,
    gate: SwitchLinear,
    up: SwitchLinear,
    down: SwitchLinear,
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
    /// Loads the block of the layer at `p` (`...layers.{i}`).
    pub(crate) fn load(
        w: &mut Weights,
        p: &str,
        d: MoeDims,
        quant: &Quantization,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        let cast = |a: Array| -> Result<Array, ModelError> {
            Ok(
                if policy == DtypePolicy::Float32 && a.dtype() != Dtype::Float32 {
                    a.as_dtype(Dtype::Float32)?
                } else {
                    a
                },
            )
        };
        let scale = cast(w.take_shaped(&format!("{p}.router.scale"), &[d.hidden])?)?;
        let norm_weight = scale.multiply(Array::from_f32(f64::from(d.hidden).powf(-0.5) as f32))?;
        norm_weight.eval()?;
        let e = format!("{p}.experts.switch_glu");
        let norm = |w: &mut Weights, name: &str| {
            RmsNorm::load(w, &format!("{p}.{name}"), d.hidden, d.eps, policy)
        };
        Ok(Self {
            proj: Linear::load(
                w,
                &format!("{p}.router.proj"),
                d.hidden,
                d.experts,
                false,
                quant,
                policy,
            )?,
            norm_weight,
            per_expert_scale: cast(
                w.take_shaped(&format!("{p}.router.per_expert_scale"), &[d.experts])?,
            )?,
            gate: SwitchLinear::load(
                w,
                &format!("{e}.gate_proj"),
                d.experts,
                d.hidden,
                d.intermediate,
                quant,
                policy,
            )?,
            up: SwitchLinear::load(
                w,
                &format!("{e}.up_proj"),
                d.experts,
                d.hidden,
                d.intermediate,
                quant,
                policy,
            )?,
            down: SwitchLinear::load(
                w,
                &format!("{e}.down_proj"),
                d.experts,
                d.intermediate,
                d.hidden,
                quant,
                policy,
            )?,
            top_k: d.top_k,
            eps: d.eps,
            post_ff_norm_1: norm(w, "post_feedforward_layernorm_1")?,
            pre_ff_norm_2: norm(w, "pre_feedforward_layernorm_2")?,
            post_ff_norm_2: norm(w, "post_feedforward_layernorm_2")?,
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

    /// The experts' mixture for `x` (the pre-normed input, `[B, L, hidden]`),
    /// routed on `h` (the block input).
    pub(crate) fn forward(&self, h: &Array, x: &Array) -> Result<Array, ModelError> {
        let (picks, weights) = self.route(h)?;
        let shape = picks.shape().to_vec();
        let x = x.expand_dims_axes(&[-2, -3])?;
        let sort = picks.size() as i32 >= SORT_FROM;
        let (x, idx, inverse) = if sort {
            let k = shape.last().copied().unwrap_or(1);
            let flat = picks.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inverse = argsort_axis(&order, 0)?;
            let rows = x
                .flatten(0, -3)?
                .take_axis(floor_divide(&order, Array::from_int(k))?, 0)?;
            (rows, flat.take_axis(&order, 0)?, Some(inverse))
        } else {
            (x, picks.clone(), None)
        };
        let up = self.up.forward(&x, &idx, sort)?;
        let gate = self.gate.forward(&x, &idx, sort)?;
        let mut y = self
            .down
            .forward(&gelu_approx(&gate)?.multiply(&up)?, &idx, sort)?;
        if let Some(inverse) = inverse {
            let mut unflat = shape.clone();
            unflat.extend_from_slice(&y.shape()[1..]);
            y = y.take_axis(&inverse, 0)?.reshape(&unflat)?;
        }
        let y = y.squeeze_axes(&[-2])?;
        Ok(weights.expand_dims(-1)?.multiply(&y)?.sum_axis(-2, None)?)
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.proj.nbytes()
            + self.norm_weight.nbytes()
            + self.per_expert_scale.nbytes()
            + self.gate.nbytes()
            + self.up.nbytes()
            + self.down.nbytes()
            + self.post_ff_norm_1.nbytes()
            + self.pre_ff_norm_2.nbytes()
            + self.post_ff_norm_2.nbytes()
    }
}
