//! Helpers shared by every crate that touches MLX: the runtime report (which
//! MLX, which BLAS, which device), MLX's quantization ops in every mode, and
//! RoPE with one offset per batch row.
#![warn(missing_docs)]

pub mod quant;
pub mod rope;
pub mod runtime;
