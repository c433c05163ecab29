//! Helpers shared by every crate that touches MLX: the runtime report (which
//! MLX, which BLAS, which device), and MLX's quantization ops in every mode.
#![warn(missing_docs)]

pub mod quant;
pub mod runtime;
