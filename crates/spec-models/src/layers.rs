//! Layers shared by the architectures, with the op sequence mlx-lm uses
//! (so equal weights give equal bits): linear (dense or affine-quantized),
//! embedding, RMS norm, SwiGLU.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{addmm, dequantize, quantized_matmul, sigmoid};
use mlx_rs::{Array, Dtype};

use crate::config::{QuantParams, Quantization};
use crate::weights::Weights;
use crate::{DtypePolicy, ModelError};

/// Packed affine-quantized weights.
#[derive(Debug)]
struct Packed {
    weight: Array,
    scales: Array,
    biases: Array,
    params: QuantParams,
}

/// Dense weights, or packed ones kept quantized.
#[derive(Debug)]
enum Kernel {
    Dense(Array),
    Quantized(Packed),
}

/// Reads `{prefix}.weight` as `[out, in]`: dense, or (with a
/// `{prefix}.scales`) quantized, dequantized to float32 under that policy.
fn load_kernel(
    w: &mut Weights,
    prefix: &str,
    out_dim: i32,
    in_dim: i32,
    quant: &Quantization,
    policy: DtypePolicy,
) -> Result<Kernel, ModelError> {
    let name = format!("{prefix}.weight");
    if !w.contains(&format!("{prefix}.scales")) {
        let weight = cast(w.take_shaped(&name, &[out_dim, in_dim])?, policy)?;
        weight.eval()?;
        return Ok(Kernel::Dense(weight));
    }
    let params = quant.for_module(prefix).ok_or_else(|| ModelError::Spec(spec_core::SpecError::Invalid(format!(
        "`{prefix}` is stored quantized but the config's quantization block has no parameters for it"
    ))))?;
    let packed_cols = in_dim * params.bits / 32;
    let weight = w.take_shaped(&name, &[out_dim, packed_cols])?;
    let scales = w.take_shaped(
        &format!("{prefix}.scales"),
        &[out_dim, in_dim / params.group_size],
    )?;
    let biases = w.take_shaped(
        &format!("{prefix}.biases"),
        &[out_dim, in_dim / params.group_size],
    )?;
    let packed = Packed {
        weight,
        scales,
        biases,
        params,
    };
    match policy {
        DtypePolicy::Keep => {
            mlx_rs::transforms::eval([&packed.weight, &packed.scales, &packed.biases])?;
            Ok(Kernel::Quantized(packed))
        }
        DtypePolicy::Float32 => {
            let dense = dequantize_packed(&packed)?.as_dtype(Dtype::Float32)?;
            dense.eval()?;
            Ok(Kernel::Dense(dense))
        }
    }
}

fn dequantize_packed(p: &Packed) -> Result<Array, ModelError> {
    Ok(dequantize(
        &p.weight,
        &p.scales,
        &p.biases,
        p.params.group_size,
        p.params.bits,
    )?)
}

fn cast(a: Array, policy: DtypePolicy) -> Result<Array, ModelError> {
    match policy {
        DtypePolicy::Float32 if a.dtype() != Dtype::Float32 => Ok(a.as_dtype(Dtype::Float32)?),
        _ => Ok(a),
    }
}

impl Kernel {
    fn nbytes(&self) -> usize {
        match self {
            Kernel::Dense(w) => w.nbytes(),
            Kernel::Quantized(p) => p.weight.nbytes() + p.scales.nbytes() + p.biases.nbytes(),
        }
    }
}

/// `y = x W^T (+ b)`, as mlx-lm's `nn.Linear` / `nn.QuantizedLinear`.
#[derive(Debug)]
pub struct Linear {
    kernel: Kernel,
    bias: Option<Array>,
}

impl Linear {
    /// Loads `{prefix}.weight` (`[out, in]`) and, if `bias`, `{prefix}.bias`.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        in_dim: i32,
        out_dim: i32,
        bias: bool,
        quant: &Quantization,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        let kernel = load_kernel(w, prefix, out_dim, in_dim, quant, policy)?;
        let bias = if bias {
            Some(cast(
                w.take_shaped(&format!("{prefix}.bias"), &[out_dim])?,
                policy,
            )?)
        } else {
            None
        };
        Ok(Self { kernel, bias })
    }

    /// Bytes of its weights.
    pub fn nbytes(&self) -> usize {
        self.kernel.nbytes() + self.bias.as_ref().map_or(0, Array::nbytes)
    }

    /// Applies the layer.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        match &self.kernel {
            Kernel::Dense(weight) => match &self.bias {
                Some(b) => Ok(addmm(b, x, weight.t(), None, None)?),
                None => Ok(x.matmul(weight.t())?),
            },
            Kernel::Quantized(p) => {
                let y = quantized_matmul(
                    x,
                    &p.weight,
                    &p.scales,
                    &p.biases,
                    true,
                    p.params.group_size,
                    p.params.bits,
                )?;
                match &self.bias {
                    Some(b) => Ok(y.add(b)?),
                    None => Ok(y),
                }
            }
        }
    }
}

/// Token embeddings, usable as the tied output head.
#[derive(Debug)]
pub struct Embedding {
    kernel: Kernel,
}

impl Embedding {
    /// Loads `{prefix}.weight` as `[vocab, dim]`.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        vocab: i32,
        dim: i32,
        quant: &Quantization,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            kernel: load_kernel(w, prefix, vocab, dim, quant, policy)?,
        })
    }

    /// Bytes of the table.
    pub fn nbytes(&self) -> usize {
        self.kernel.nbytes()
    }

    /// Rows for `ids` (any shape) -> `[..., dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array, ModelError> {
        match &self.kernel {
            Kernel::Dense(weight) => Ok(weight.take_axis(ids, 0)?),
            Kernel::Quantized(p) => {
                let rows = |a: &Array| a.take_axis(ids, 0);
                Ok(dequantize(
                    rows(&p.weight)?,
                    rows(&p.scales)?,
                    &rows(&p.biases)?,
                    p.params.group_size,
                    p.params.bits,
                )?)
            }
        }
    }

    /// The tied head: `x E^T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array, ModelError> {
        match &self.kernel {
            Kernel::Dense(weight) => Ok(x.matmul(weight.t())?),
            Kernel::Quantized(p) => Ok(quantized_matmul(
                x,
                &p.weight,
                &p.scales,
                &p.biases,
                true,
                p.params.group_size,
                p.params.bits,
            )?),
        }
    }
}

/// RMS normalisation with a learned scale (`mx.fast.rms_norm`).
#[derive(Debug)]
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Loads `{prefix}.weight` of width `dim`.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        dim: i32,
        eps: f32,
        policy: DtypePolicy,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            weight: cast(w.take_shaped(&format!("{prefix}.weight"), &[dim])?, policy)?,
            eps,
        })
    }

    /// Bytes of its scale.
    pub fn nbytes(&self) -> usize {
        self.weight.nbytes()
    }

    /// Applies the norm over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// `silu(gate) * up`, with `silu(x) = x * sigmoid(x)`.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array, ModelError> {
    Ok(gate.multiply(sigmoid(gate)?)?.multiply(up)?)
}

/// The outputs of the tapped layers (`(layer, output)` pairs) in the order
/// `taps` lists them, concatenated on the last axis; `None` without taps.
pub fn concat_taps(taps: &[usize], tapped: &[(usize, Array)]) -> Result<Option<Array>, ModelError> {
    if taps.is_empty() {
        return Ok(None);
    }
    let ordered: Vec<&Array> = taps
        .iter()
        .filter_map(|t| tapped.iter().find(|(i, _)| i == t).map(|(_, a)| a))
        .collect();
    Ok(Some(mlx_rs::ops::concatenate(&ordered, -1)?))
}

/// The last position of `[B, L, D]`, kept as `[B, 1, D]`.
pub fn last_position(x: &Array) -> Array {
    x.index((.., -1.., ..))
}
