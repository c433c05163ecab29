//! Weights stacked on a leading axis, `[n, out, in]`, dense or
//! quantized (any MLX mode) as mlx-lm stores them: per-head projections
//! (`MultiLinear`: `embed_q`, `unembed_out`) and routed experts
//! (`SwitchLinear`, applied with `gather_mm` / `gather_qmm`), shared by the
//! GLM and Gemma-4 mixtures of experts.

use mlx_ext::quant::{Packed, QuantParams};
use mlx_rs::ops::{concatenate, gather_mm};
use mlx_rs::{Array, Dtype};

use crate::weights::WeightsView;
use crate::{DtypePolicy, ModelError};

/// Stacked weights as a checkpoint stores them.
#[derive(Debug)]
pub enum Stored {
    /// Float weights `[n, out, in]`.
    Dense(Array),
    /// Quantized weights in any MLX mode.
    Quantized(Packed),
}

#[derive(Debug, Clone)]
enum Kernel {
    Dense(Array),
    Quantized(Packed),
}

/// `[n, out, in]` weights (a clone shares the arrays).
#[derive(Debug, Clone)]
pub struct Stacked {
    kernel: Kernel,
}

impl Stacked {
    /// Loads `weight` under `vb` as `[n, out, in]` (with `scales` and, in
    /// affine mode, `biases` when quantized).
    pub fn load(
        vb: &WeightsView<'_>,
        n: i32,
        out_dim: i32,
        in_dim: i32,
    ) -> Result<Self, ModelError> {
        let stored = if vb.is_quantized()? {
            Stored::Quantized(vb.take_packed(&[n], out_dim, in_dim)?)
        } else {
            Stored::Dense(vb.take_shaped("weight", &[n, out_dim, in_dim])?)
        };
        Self::from_stored(stored, vb.policy())
    }

    /// Loads `weight` under `vb` as `[n, out, in]` kept at 8 bits whatever
    /// the dtype policy: float weights are quantized once (affine, group
    /// 32, in the policy's dtype); stored 8-bit weights (any mode) are
    /// kept; narrower ones are an error naming the module and `option`.
    pub fn load_8bit(
        vb: &WeightsView<'_>,
        n: i32,
        out_dim: i32,
        in_dim: i32,
        option: &str,
    ) -> Result<Self, ModelError> {
        let packed = if vb.is_quantized()? {
            let packed = vb.take_packed(&[n], out_dim, in_dim)?;
            if packed.params().bits != 8 {
                return Err(ModelError::Quantized {
                    module: vb.prefix().to_owned(),
                    message: format!(
                        "stored at {} bits; `{option} 8` needs them at 8 bits",
                        packed.params().bits
                    ),
                });
            }
            packed
        } else {
            let w = vb.take_cast("weight", &[n, out_dim, in_dim])?;
            Packed::quantize(&w, QuantParams::affine(32, 8))?
        };
        Self::from_stored(Stored::Quantized(packed), DtypePolicy::Keep)
    }

    /// Bits per weight when kept quantized (`None`: dense).
    pub fn bits(&self) -> Option<i32> {
        match &self.kernel {
            Kernel::Dense(_) => None,
            Kernel::Quantized(p) => Some(p.params().bits),
        }
    }

    /// Weights as the checkpoint stores them, converted as `policy` says
    /// (float32 under `Float32`, quantized ones dequantized; untouched under
    /// `Keep`) and evaluated.
    pub fn from_stored(stored: Stored, policy: DtypePolicy) -> Result<Self, ModelError> {
        let kernel = match (stored, policy) {
            (Stored::Dense(w), DtypePolicy::Float32) if w.dtype() != Dtype::Float32 => {
                Kernel::Dense(w.as_dtype(Dtype::Float32)?)
            }
            (Stored::Dense(w), _) => Kernel::Dense(w),
            (Stored::Quantized(p), DtypePolicy::Keep) => Kernel::Quantized(p),
            (Stored::Quantized(p), DtypePolicy::Float32) => {
                Kernel::Dense(p.dequantize()?.as_dtype(Dtype::Float32)?)
            }
        };
        match &kernel {
            Kernel::Dense(w) => w.eval()?,
            Kernel::Quantized(p) => p.eval()?,
        }
        Ok(Self { kernel })
    }

    /// The stacks of `parts` one after another on the leading axis (each
    /// part converted alike): a compact stack of some experts.
    pub fn concat(parts: &[&Stacked]) -> Result<Self, ModelError> {
        let dense: Option<Vec<&Array>> = parts
            .iter()
            .map(|p| match &p.kernel {
                Kernel::Dense(w) => Some(w),
                Kernel::Quantized(_) => None,
            })
            .collect();
        if let Some(dense) = dense {
            return Ok(Self {
                kernel: Kernel::Dense(concatenate(&dense, 0)?),
            });
        }
        let packed: Option<Vec<&Packed>> = parts
            .iter()
            .map(|p| match &p.kernel {
                Kernel::Quantized(q) => Some(q),
                Kernel::Dense(_) => None,
            })
            .collect();
        let Some(packed) = packed.filter(|p| !p.is_empty()) else {
            return Err(ModelError::Quantized {
                module: "stacked experts".into(),
                message: "cannot stack dense and quantized parts together".into(),
            });
        };
        let params = packed[0].params();
        let join = |f: &dyn Fn(&Packed) -> &Array| -> Result<Array, ModelError> {
            let all: Vec<&Array> = packed.iter().map(|p| f(p)).collect();
            Ok(concatenate(&all, 0)?)
        };
        let biases = if params.mode.has_biases() {
            let all: Option<Vec<&Array>> = packed.iter().map(|p| p.biases()).collect();
            all.map(|b| concatenate(&b, 0)).transpose()?
        } else {
            None
        };
        Ok(Self {
            kernel: Kernel::Quantized(Packed::from_parts(
                join(&|p| p.weight())?,
                join(&|p| p.scales())?,
                biases,
                params,
            )?),
        })
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match &self.kernel {
            Kernel::Dense(w) => w.nbytes(),
            Kernel::Quantized(p) => p.nbytes(),
        }
    }

    /// mlx-lm's `MultiLinear`: `x W^T` per head (`transpose`), or `x W`.
    pub fn per_head(&self, x: &Array, transpose: bool) -> Result<Array, ModelError> {
        Ok(match &self.kernel {
            Kernel::Dense(w) if transpose => x.matmul(w.swap_axes(-1, -2)?)?,
            Kernel::Dense(w) => x.matmul(w)?,
            Kernel::Quantized(p) => p.matmul(x, transpose)?,
        })
    }

    /// mlx-lm's `SwitchLinear`: each row of `x` through the expert `indices` names.
    pub fn gather(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array, ModelError> {
        Ok(match &self.kernel {
            Kernel::Dense(w) => gather_mm(x, w.swap_axes(-1, -2)?, None, indices, sorted)?,
            Kernel::Quantized(p) => p.gather_matmul(x, None, Some(indices), true, sorted)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use mlx_ext::quant::QuantMode;

    use super::*;
    use crate::config::Quantization;
    use crate::weights::testing::{max_abs_diff, packed_store, random};

    /// Every mode: the experts through `gather_qmm` and the per-head
    /// products (both orientations) agree with the dense stack.
    #[test]
    fn stacks_load_and_gather_in_every_mode_under_both_policies() {
        let x = random(&[2, 1, 1, 1, 64], 30);
        let experts = Array::from_slice(&[3u32, 1, 0, 3], &[2, 1, 2]);
        let per_head_x = random(&[1, 4, 2, 64], 31);
        let per_head_xt = random(&[1, 4, 2, 8], 32);
        for mode in QuantMode::ALL {
            let params = mode.default_params();
            // Only named modules: nothing to infer, every entry explicit.
            let block = serde_json::json!({
                "group_size": params.group_size, "bits": params.bits, "mode": mode.as_str()
            });
            let quant =
                Quantization::parse(Some(&block), std::path::Path::new("c.json")).expect("block");
            let load = |policy| {
                let (w, dense) = packed_store(&[("switch", &[4, 8, 64])], params, 33);
                let stacked =
                    Stacked::load(&w.view(&quant, policy).pp("switch"), 4, 8, 64).expect("stacked");
                w.finish().expect("every tensor taken");
                (stacked, dense)
            };
            let (q, dense) = load(DtypePolicy::Keep);
            let (f, _) = load(DtypePolicy::Float32);
            let got = q.gather(&x, &experts, false).expect("gather_qmm");
            let want = f.gather(&x, &experts, false).expect("gather_mm");
            assert_eq!(got.shape(), &[2, 1, 2, 1, 8]);
            assert!(max_abs_diff(&got, &want) < 1e-4, "{mode}: gather");
            let reference = x
                .reshape(&[2, 1, 64])
                .and_then(|r| r.matmul(dense["switch"].take_axis(Array::from_int(3), 0)?.t()))
                .expect("reference");
            let first = got
                .reshape(&[2, 2, 8])
                .expect("r")
                .take_axis(Array::from_int(0), 1)
                .expect("r");
            let expected = reference.take_axis(Array::from_int(0), 0).expect("r");
            assert!(
                max_abs_diff(
                    &first.take_axis(Array::from_int(0), 0).expect("r"),
                    &expected.reshape(&[8]).expect("r")
                ) < 1e-4,
                "{mode}: row 0 through expert 3"
            );
            let a = q.per_head(&per_head_x, true).expect("x W^T");
            let b = f.per_head(&per_head_x, true).expect("x W^T");
            assert!(max_abs_diff(&a, &b) < 1e-4, "{mode}: per head");
            let a = q.per_head(&per_head_xt, false).expect("x W");
            let b = f.per_head(&per_head_xt, false).expect("x W");
            assert_eq!(a.shape(), &[1, 4, 2, 64]);
            assert!(
                max_abs_diff(&a, &b) < 1e-4,
                "{mode}: per head, untransposed"
            );
        }
    }
}
