//! SwiGLU's `silu(gate) * up` as MLX computes it, with the CPU's vector
//! units.
//!
//! `silu(g) = g * sigmoid(g)`, and MLX's CPU `sigmoid` is
//! `y = 1 / (1 + exp(|g|))`, then `y` for negative `g` and `1 - y` else,
//! with the same scalar `exp` its softmax uses (see [`crate::softmax`]).
//! [`swiglu`] computes `(g * sigmoid(g)) * up` element by element with the
//! same operations, a vector of elements at a time, so the bits are those of
//! MLX's three ops; a probe compares once per process and MLX's ops run
//! where it differs.

use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::ops::sigmoid;
use mlx_rs::{Array, Dtype};

use crate::softmax::exp;

/// MLX's float32 `sigmoid`, one element.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    let y = 1.0 / (1.0 + exp(x.abs()));
    if x < 0.0 {
        y
    } else {
        1.0 - y
    }
}

/// `(gate * sigmoid(gate)) * up`, element by element, into `out`.
///
/// # Panics
/// If the three slices' lengths differ.
pub fn swiglu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu: gate, up and output lengths"
    );
    kernel::swiglu(gate, up, out)
}

/// `gate * sigmoid(gate) * up` (MLX's ops, in that order), evaluated now
/// with [`swiglu_into`] where that gives MLX's bits (float32, row-major
/// arrays of one shape, the probe passed), else with MLX's ops (lazily).
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array, Exception> {
    let fits = gate.dtype() == Dtype::Float32
        && up.dtype() == Dtype::Float32
        && gate.shape() == up.shape()
        && matches_mlx();
    if fits {
        mlx_rs::transforms::eval([gate, up])?;
        if let (Ok(g), Ok(u)) = (gate.try_as_slice::<f32>(), up.try_as_slice::<f32>()) {
            let mut out = crate::host::take(g.len());
            swiglu_into(g, u, &mut out);
            return Ok(crate::host::hand_over(out, gate.shape()));
        }
    }
    gate.multiply(sigmoid(gate)?)?.multiply(up)
}

/// Whether [`swiglu_into`] gives the bits of MLX's ops here: checked once
/// per process on gates across the exponential's range and its cut-offs,
/// both zeros, infinities and a NaN.
pub fn matches_mlx() -> bool {
    static MATCHES: OnceLock<bool> = OnceLock::new();
    *MATCHES.get_or_init(|| probe().unwrap_or(false))
}

fn probe() -> Result<bool, Exception> {
    let mut gate: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.047).collect();
    gate.extend([0.0, -0.0, 88.5, -88.5, 1e-30, -1e-30, f32::INFINITY]);
    gate.extend([f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN]);
    let up: Vec<f32> = (0..gate.len())
        .map(|i| (i % 17) as f32 * 0.3 - 2.0)
        .collect();
    let n = [gate.len() as i32];
    let (g, u) = (Array::from_slice(&gate, &n), Array::from_slice(&up, &n));
    let theirs = g.multiply(sigmoid(&g)?)?.multiply(&u)?;
    let mut ours = vec![0.0_f32; gate.len()];
    swiglu_into(&gate, &up, &mut ours);
    crate::vector::same_bits(&ours, &theirs)
}

/// The element kernel, compiled for AVX-512, AVX2 and the baseline.
mod kernel {
    use super::sigmoid_f32;

    #[inline(always)]
    fn generic(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = (*g * sigmoid_f32(*g)) * *u;
        }
    }

    crate::vector::vectorised! {
        fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
            generic(gate, up, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gates over the range a model's activations take (and past it), ups
    /// of both signs: ours equals MLX's three ops bit for bit.
    #[test]
    fn swiglu_gives_mlx_bits() -> Result<(), Exception> {
        assert!(matches_mlx(), "the probe failed on this machine");
        let key = mlx_rs::random::key(5)?;
        for (shape, spread) in [
            ([1, 1, 7], 1.0),
            ([2, 5, 1536], 4.0),
            ([1, 300, 1536], 30.0),
        ] {
            let g = mlx_rs::random::normal::<f32>(&shape, None, Some(spread), &key)?;
            let u = mlx_rs::random::normal::<f32>(&shape, None, None, &key)?
                .add(Array::from_f32(0.1))?;
            let ours = swiglu(&g, &u)?;
            let theirs = g.multiply(sigmoid(&g)?)?.multiply(&u)?;
            assert_eq!(ours.shape(), theirs.shape());
            assert!(
                crate::vector::same_arrays(&ours, &theirs)?,
                "{shape:?}: bits differ"
            );
        }
        Ok(())
    }
}
