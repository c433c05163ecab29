//! Weights stacked on a leading axis, `[n, out, in]`, dense or
//! affine-quantized as mlx-lm stores them: per-head projections
//! (`MultiLinear`: `embed_q`, `unembed_out`) and routed experts
//! (`SwitchLinear`, applied with `gather_mm` / `gather_qmm`), shared by the
//! GLM and Gemma-4 mixtures of experts.

use mlx_rs::ops::{dequantize, gather_mm, gather_qmm, quantized_matmul};
use mlx_rs::{Array, Dtype};

use crate::config::QuantParams;
use crate::weights::WeightsView;
use crate::{DtypePolicy, ModelError};

#[derive(Debug)]
enum Kernel {
    Dense(Array),
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        params: QuantParams,
    },
}

/// `[n, out, in]` weights.
#[derive(Debug)]
pub(crate) struct Stacked {
    kernel: Kernel,
}

impl Stacked {
    /// Loads `weight` under `vb` as `[n, out, in]` (with `scales` /
    /// `biases` when quantized).
    pub fn load(
        vb: &WeightsView<'_>,
        n: i32,
        out_dim: i32,
        in_dim: i32,
    ) -> Result<Self, ModelError> {
        if !vb.contains("scales") {
            let weight = vb.take_cast("weight", &[n, out_dim, in_dim])?;
            weight.eval()?;
            return Ok(Self {
                kernel: Kernel::Dense(weight),
            });
        }
        let params = vb.quant_params()?;
        let weight = vb.take_shaped("weight", &[n, out_dim, in_dim * params.bits / 32])?;
        let groups = in_dim / params.group_size;
        let scales = vb.take_shaped("scales", &[n, out_dim, groups])?;
        let biases = vb.take_shaped("biases", &[n, out_dim, groups])?;
        let kernel = match vb.policy() {
            DtypePolicy::Keep => {
                mlx_rs::transforms::eval([&weight, &scales, &biases])?;
                Kernel::Quantized {
                    weight,
                    scales,
                    biases,
                    params,
                }
            }
            DtypePolicy::Float32 => {
                let dense = dequantize(&weight, &scales, &biases, params.group_size, params.bits)?
                    .as_dtype(Dtype::Float32)?;
                dense.eval()?;
                Kernel::Dense(dense)
            }
        };
        Ok(Self { kernel })
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match &self.kernel {
            Kernel::Dense(w) => w.nbytes(),
            Kernel::Quantized {
                weight,
                scales,
                biases,
                ..
            } => weight.nbytes() + scales.nbytes() + biases.nbytes(),
        }
    }

    /// mlx-lm's `MultiLinear`: `x W^T` per head (`transpose`), or `x W`.
    pub fn per_head(&self, x: &Array, transpose: bool) -> Result<Array, ModelError> {
        Ok(match &self.kernel {
            Kernel::Dense(w) if transpose => x.matmul(w.swap_axes(-1, -2)?)?,
            Kernel::Dense(w) => x.matmul(w)?,
            Kernel::Quantized {
                weight,
                scales,
                biases,
                params,
            } => quantized_matmul(
                x,
                weight,
                scales,
                biases,
                transpose,
                params.group_size,
                params.bits,
            )?,
        })
    }

    /// mlx-lm's `SwitchLinear`: each row of `x` through the expert `indices` names.
    pub fn gather(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array, ModelError> {
        Ok(match &self.kernel {
            Kernel::Dense(w) => gather_mm(x, w.swap_axes(-1, -2)?, None, indices, sorted)?,
            Kernel::Quantized {
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
}
