//! Helpers shared by every crate that touches MLX: the runtime report (which
//! MLX, which BLAS, which device) and small conversions between arrays and
//! Rust values.
#![warn(missing_docs)]

pub mod runtime;
