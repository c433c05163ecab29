//! Layers shared by the architectures, with the op sequence mlx-lm uses
//! (so equal weights give equal bits): linear (dense or quantized in any of
//! MLX's modes),
//! embedding, RMS norm, gated MLPs (SwiGLU, GeGLU with the tanh GELU).

use mlx_ext::quant::Packed;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{addmm, power, sigmoid, tanh};
use mlx_rs::{Array, Dtype};

use crate::adapter::LowRank;
use crate::weights::WeightsView;
use crate::{DtypePolicy, ModelError};

/// Dense weights, or packed ones kept quantized (any MLX mode).
#[derive(Debug)]
enum Kernel {
    Dense(Array),
    Quantized(Packed),
}

/// Reads `{prefix}.weight` as `[out, in]`: dense, or (with a
/// `{prefix}.scales`) quantized, dequantized to float32 under that policy.
fn load_kernel(vb: &WeightsView<'_>, out_dim: i32, in_dim: i32) -> Result<Kernel, ModelError> {
    if !vb.is_quantized()? {
        let weight = vb.take_cast("weight", &[out_dim, in_dim])?;
        weight.eval()?;
        return Ok(Kernel::Dense(weight));
    }
    let packed = vb.take_packed(&[], out_dim, in_dim)?;
    match vb.policy() {
        DtypePolicy::Keep => {
            packed.eval()?;
            Ok(Kernel::Quantized(packed))
        }
        DtypePolicy::Float32 => {
            let dense = packed.dequantize()?.as_dtype(Dtype::Float32)?;
            dense.eval()?;
            Ok(Kernel::Dense(dense))
        }
    }
}

impl Kernel {
    /// `x W^T`: a dense matmul, or `quantized_matmul` on the packed weights.
    fn matmul_t(&self, x: &Array) -> Result<Array, ModelError> {
        match self {
            Kernel::Dense(weight) => Ok(x.matmul(weight.t())?),
            Kernel::Quantized(p) => Ok(p.matmul(x, true)?),
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            Kernel::Dense(w) => w.nbytes(),
            Kernel::Quantized(p) => p.nbytes(),
        }
    }

    /// The weight as a float matrix (dequantized where packed).
    fn dense(&self) -> Result<Array, ModelError> {
        match self {
            Kernel::Dense(w) => Ok(w.clone()),
            Kernel::Quantized(p) => Ok(p.dequantize()?),
        }
    }
}

/// `y = x W^T (+ b)`, as mlx-lm's `nn.Linear` / `nn.QuantizedLinear`; with
/// a fine-tuned adapter's update under its name, as mlx-lm's `LoRALinear`
/// / `DoRALinear` (`crate::adapter`).
#[derive(Debug)]
pub struct Linear {
    kernel: Kernel,
    bias: Option<Array>,
    low_rank: Option<Box<LowRank>>,
}

impl Linear {
    /// Loads `weight` (`[out, in]`) and, if `bias`, `bias` under `vb`.
    pub fn load(
        vb: &WeightsView<'_>,
        in_dim: i32,
        out_dim: i32,
        bias: bool,
    ) -> Result<Self, ModelError> {
        let mut kernel = load_kernel(vb, out_dim, in_dim)?;
        let bias = if bias {
            Some(vb.take_cast("bias", &[out_dim])?)
        } else {
            None
        };
        let low_rank = LowRank::load(vb, in_dim, out_dim, || kernel.dense())?.map(Box::new);
        if low_rank.as_ref().is_some_and(|l| l.is_dora()) {
            // DoRA multiplies by the dequantized weight.
            let dense = kernel.dense()?;
            dense.eval()?;
            kernel = Kernel::Dense(dense);
        }
        Ok(Self {
            kernel,
            bias,
            low_rank,
        })
    }

    /// Bytes of its weights.
    pub fn nbytes(&self) -> usize {
        self.kernel.nbytes()
            + self.bias.as_ref().map_or(0, Array::nbytes)
            + self.low_rank.as_ref().map_or(0, |l| l.nbytes())
    }

    /// Applies the layer.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        let Some(low_rank) = &self.low_rank else {
            return self.base(x);
        };
        if !low_rank.is_dora() {
            return low_rank.apply(x, self.base(x)?);
        }
        // DoRA: `x W^T`, the update, the row factor, then the bias.
        let out = low_rank.apply(x, self.kernel.matmul_t(x)?)?;
        match &self.bias {
            Some(b) => Ok(out.add(b)?),
            None => Ok(out),
        }
    }

    /// The layer without an adapter.
    fn base(&self, x: &Array) -> Result<Array, ModelError> {
        match (&self.kernel, &self.bias) {
            (Kernel::Dense(weight), Some(b)) => Ok(addmm(b, x, weight.t(), None, None)?),
            (_, Some(b)) => Ok(self.kernel.matmul_t(x)?.add(b)?),
            (_, None) => self.kernel.matmul_t(x),
        }
    }
}

/// Token embeddings, usable as the tied output head.
#[derive(Debug)]
pub struct Embedding {
    kernel: Kernel,
}

impl Embedding {
    /// Loads `weight` under `vb` as `[vocab, dim]`.
    pub fn load(vb: &WeightsView<'_>, vocab: i32, dim: i32) -> Result<Self, ModelError> {
        Ok(Self {
            kernel: load_kernel(vb, vocab, dim)?,
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
            Kernel::Quantized(p) => Ok(p.take_rows(ids)?.dequantize()?),
        }
    }

    /// The tied head: `x E^T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array, ModelError> {
        self.kernel.matmul_t(x)
    }
}

/// RMS normalisation with a learned scale (`mx.fast.rms_norm`).
#[derive(Debug)]
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Loads `weight` under `vb`, of width `dim`.
    pub fn load(vb: &WeightsView<'_>, dim: i32, eps: f32) -> Result<Self, ModelError> {
        Ok(Self {
            weight: vb.take_cast("weight", &[dim])?,
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

/// The gate's activation in a [`GatedMlp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu` (SwiGLU: llama, GLM).
    Silu,
    /// [`gelu_approx`] (GeGLU: Gemma, its drafters).
    GeluApprox,
    /// [`swiglu_oai`] (gpt-oss's clamped SwiGLU).
    SwigluOai,
}

impl Activation {
    /// `act(gate) * up`, as the activation combines the two projections.
    pub fn gated(self, gate: &Array, up: &Array) -> Result<Array, ModelError> {
        match self {
            Activation::Silu => swiglu(gate, up),
            Activation::GeluApprox => Ok(gelu_approx(gate)?.multiply(up)?),
            Activation::SwigluOai => swiglu_oai(gate, up),
        }
    }
}

/// `down(act(gate(x)) * up(x))`, from `gate_proj`, `up_proj`, `down_proj`.
#[derive(Debug)]
pub struct GatedMlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    act: Activation,
}

impl GatedMlp {
    /// Loads the three projections under `vb` (`hidden -> width -> hidden`).
    pub fn load(
        vb: &WeightsView<'_>,
        hidden: i32,
        width: i32,
        bias: bool,
        act: Activation,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            gate: Linear::load(&vb.pp("gate_proj"), hidden, width, bias)?,
            up: Linear::load(&vb.pp("up_proj"), hidden, width, bias)?,
            down: Linear::load(&vb.pp("down_proj"), width, hidden, bias)?,
            act,
        })
    }

    /// Bytes of its weights.
    pub fn nbytes(&self) -> usize {
        self.gate.nbytes() + self.up.nbytes() + self.down.nbytes()
    }

    /// Applies the MLP.
    pub fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        let gate = self.gate.forward(x)?;
        let gated = self.act.gated(&gate, &self.up.forward(x)?)?;
        self.down.forward(&gated)
    }
}

/// `silu(gate) * up`, with `silu(x) = x * sigmoid(x)`. From
/// [`EAGER_SWIGLU`] elements on, evaluated where it stands and computed by
/// [`mlx_ext::swiglu`] (MLX's bits, vectorised); smaller ones stay in the
/// lazy graph, where the pause to evaluate would cost more.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array, ModelError> {
    if gate.size() >= EAGER_SWIGLU {
        return Ok(mlx_ext::swiglu::swiglu(gate, up)?);
    }
    Ok(gate.multiply(sigmoid(gate)?)?.multiply(up)?)
}

/// See [`swiglu`].
const EAGER_SWIGLU: usize = 1 << 13;

/// gpt-oss's SwiGLU (mlx-lm's `swiglu_oai`, alpha 1.702, limit 7): the
/// gate clamped from above, the linear part into `[-7, 7]`, then
/// `(up + 1) * (gate * sigmoid(alpha * gate))`; its Python scalars take
/// the operands' dtype. mlx-lm compiles it; MLX's compiled form gives the
/// bits of these ops (checked against it by the parity gate).
pub fn swiglu_oai(gate: &Array, up: &Array) -> Result<Array, ModelError> {
    let scalar = |v: f32, like: &Array| Array::from_f32(v).as_dtype(like.dtype());
    let limit = 7.0;
    let gate = mlx_rs::ops::minimum(gate, scalar(limit, gate)?)?;
    let up = mlx_rs::ops::clip(up, (scalar(-limit, up)?, scalar(limit, up)?))?;
    let glu = gate.multiply(sigmoid(&scalar(1.702, &gate)?.multiply(&gate)?)?)?;
    Ok(up.add(scalar(1.0, &up)?)?.multiply(&glu)?)
}

/// `gelu_approx(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, with
/// the op order of mlx's `nn.gelu_approx` (PyTorch's `gelu_pytorch_tanh`).
pub fn gelu_approx(x: &Array) -> Result<Array, ModelError> {
    let c = (2.0f64 / std::f64::consts::PI).sqrt() as f32;
    let cubic = Array::from_f32(0.044715).multiply(power(x, Array::from_f32(3.0))?)?;
    let inner = Array::from_f32(c).multiply(x.add(&cubic)?)?;
    let gate = Array::from_f32(1.0).add(tanh(&inner)?)?;
    Ok(Array::from_f32(0.5).multiply(x)?.multiply(&gate)?)
}

/// Logit soft-capping, `tanh(x / cap) * cap` (Gemma and its drafters).
pub fn softcap(x: &Array, cap: f32) -> Result<Array, ModelError> {
    Ok(tanh(&x.divide(Array::from_f32(cap))?)?.multiply(Array::from_f32(cap))?)
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

#[cfg(test)]
mod tests {
    use mlx_ext::quant::QuantMode;

    use super::*;
    use crate::config::Quantization;
    use crate::weights::testing::{max_abs_diff, packed_store, random};

    /// Every mode, kept packed and dequantized to float32: the quantized
    /// linear, embedding lookup and tied head agree with the dense ones.
    #[test]
    fn linear_and_embedding_load_every_mode_under_both_policies() {
        let x = random(&[2, 3, 64], 20);
        let ids = Array::from_slice(&[5u32, 0, 5, 11], &[1, 4]);
        for mode in QuantMode::ALL {
            let params = mode.default_params();
            let block = serde_json::json!({
                "group_size": params.group_size, "bits": params.bits, "mode": mode.as_str()
            });
            let quant =
                Quantization::parse(Some(&block), std::path::Path::new("c.json")).expect("block");
            let load = |policy| {
                let (w, dense) =
                    packed_store(&[("proj", &[12, 64]), ("embed", &[16, 64])], params, 21);
                let vb = w.view(&quant, policy);
                let linear = Linear::load(&vb.pp("proj"), 64, 12, false).expect("linear");
                let embedding = Embedding::load(&vb.pp("embed"), 16, 64).expect("embedding");
                w.finish().expect("every tensor taken");
                (linear, embedding, dense)
            };
            let (q_linear, q_embed, dense) = load(DtypePolicy::Keep);
            let (f_linear, f_embed, _) = load(DtypePolicy::Float32);
            assert!(q_linear.nbytes() < f_linear.nbytes(), "{mode}: kept packed");
            let q = q_linear.forward(&x).expect("quantized");
            let f = f_linear.forward(&x).expect("dense");
            assert_eq!(q.shape(), &[2, 3, 12]);
            assert!(max_abs_diff(&q, &f) < 1e-4, "{mode}: linear");
            let reference = x.matmul(dense["proj"].t()).expect("reference");
            assert!(
                max_abs_diff(&q, &reference) < 1e-4,
                "{mode}: linear vs dequantized"
            );

            let rows = q_embed.forward(&ids).expect("rows");
            let expected = dense["embed"].take_axis(&ids, 0).expect("take");
            assert_eq!(rows.shape(), &[1, 4, 64]);
            assert_eq!(
                max_abs_diff(&rows, &expected),
                0.0,
                "{mode}: embedding rows"
            );
            assert_eq!(
                max_abs_diff(&f_embed.forward(&ids).expect("f32"), &expected),
                0.0
            );
            let head = q_embed.as_linear(&x).expect("tied head");
            let f_head = f_embed.as_linear(&x).expect("tied head");
            assert!(max_abs_diff(&head, &f_head) < 1e-4, "{mode}: tied head");
        }
    }
}
