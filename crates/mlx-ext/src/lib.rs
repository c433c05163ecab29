//! Helpers shared by every crate that touches MLX: the runtime report (which
//! MLX, which BLAS, which device), MLX's quantization ops in every mode,
//! RoPE with one offset per batch row, MLX's float32 softmax, log-softmax,
//! SwiGLU and gated delta recurrence on the CPU's vector units, and a token
//! mask applied to float32 logits on the host.
#![warn(missing_docs)]

pub mod gated_delta;
mod host;
pub mod mask;
pub mod quant;
pub mod rope;
pub mod runtime;
pub mod softmax;
pub mod swiglu;
mod vector;
