//! `mx.fast.rope` with its offset given as an array: one starting position
//! per batch row (`[B]` int32), so rows at different positions rotate in one
//! op. mlx-rs 0.33 exposes only the integer offset; the C function under
//! the array form is `mlx_fast_rope_dynamic`. MLX computes both forms with
//! the same element-wise sequence (positions `arange(L) + offset`, times the
//! scale, times the inverse frequencies), so a row rotated here gives the
//! bits of the same row rotated alone at its offset.

use mlx_rs::{Array, Dtype, Stream};

use crate::quant::{empty_array, ensure_error_handler};

/// Why a rotation was refused.
#[derive(Debug, thiserror::Error)]
pub enum RopeError {
    /// Inputs MLX would refuse: shapes, dtypes, or a missing base and frequencies.
    #[error("rope: {0}")]
    Input(String),
    /// MLX returned an error status for inputs that passed our checks.
    #[error("rope: MLX refused the operation (status {0})")]
    Refused(i32),
}

/// Where the frequencies come from: a base (`default`, `linear` scaling)
/// or precomputed per-pair frequencies (`llama3`, proportional).
#[derive(Debug, Clone, Copy)]
pub enum RopeFreqs<'a> {
    /// `base^(-2i / dims)`.
    Base(f32),
    /// One frequency per rotated pair (`[dims / 2]`).
    Freqs(&'a Array),
}

/// Rotates `x` (`[B, heads, L, D]`) whose row `b` starts at position
/// `offsets[b]` (`offsets`: `[B]`, int32), as `mx.fast.rope` does.
pub fn rope_rows(
    x: &Array,
    dims: i32,
    traditional: bool,
    freqs: RopeFreqs<'_>,
    scale: f32,
    offsets: &Array,
) -> Result<Array, RopeError> {
    let shape = x.shape();
    if shape.len() != 4 {
        return Err(RopeError::Input(format!(
            "x must be [B, heads, L, D], got {shape:?}"
        )));
    }
    if offsets.ndim() != 1 || offsets.shape()[0] != shape[0] {
        return Err(RopeError::Input(format!(
            "offsets must be [{}], got {:?}",
            shape[0],
            offsets.shape()
        )));
    }
    if offsets.dtype() != Dtype::Int32 {
        return Err(RopeError::Input(format!(
            "offsets must be int32, got {:?}",
            offsets.dtype()
        )));
    }
    if dims <= 0 || dims % 2 != 0 || dims > shape[3] {
        return Err(RopeError::Input(format!(
            "dims {dims} must be even, positive and at most {}",
            shape[3]
        )));
    }
    ensure_error_handler();
    let stream = Stream::thread_local_or_default();
    let no_freqs = empty_array();
    let (base, freqs) = match freqs {
        RopeFreqs::Base(b) => (
            mlx_sys::mlx_optional_float {
                value: b,
                has_value: true,
            },
            &no_freqs,
        ),
        RopeFreqs::Freqs(f) => (
            mlx_sys::mlx_optional_float {
                value: 0.0,
                has_value: false,
            },
            f,
        ),
    };
    // SAFETY: `res` is a fresh array the call fills and the returned Array
    // owns; every argument outlives the call.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_fast_rope_dynamic(
            &mut res,
            x.as_ptr(),
            dims,
            traditional,
            base,
            scale,
            offsets.as_ptr(),
            freqs.as_ptr(),
            stream.as_ptr(),
        );
        let array = Array::from_ptr(res);
        if status == 0 {
            Ok(array)
        } else {
            Err(RopeError::Refused(status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_of_the_wrong_shape_or_dtype_are_refused() {
        let x = mlx_rs::ops::zeros::<f32>(&[2, 1, 3, 8]).expect("x");
        let one = Array::from_slice(&[1i32], &[1]);
        let err = rope_rows(&x, 8, false, RopeFreqs::Base(1e4), 1.0, &one).expect_err("shape");
        assert!(err.to_string().contains("offsets must be [2]"), "{err}");
        let float = Array::from_slice(&[1f32, 2.0], &[2]);
        let err = rope_rows(&x, 8, false, RopeFreqs::Base(1e4), 1.0, &float).expect_err("dtype");
        assert!(err.to_string().contains("int32"), "{err}");
        let two = Array::from_slice(&[1i32, 2], &[2]);
        let err = rope_rows(&x, 9, false, RopeFreqs::Base(1e4), 1.0, &two).expect_err("dims");
        assert!(err.to_string().contains("dims 9"), "{err}");
        let bad_freqs = Array::from_slice(&[1f32], &[1]);
        let err = rope_rows(&x, 8, false, RopeFreqs::Freqs(&bad_freqs), 1.0, &two)
            .expect_err("freqs of the wrong length");
        assert!(matches!(err, RopeError::Refused(_)), "{err}");
    }

    #[test]
    fn each_row_turns_at_its_own_offset() {
        let x = mlx_rs::ops::ones::<f32>(&[2, 1, 1, 4]).expect("x");
        let offsets = Array::from_slice(&[0i32, 3], &[2]);
        let y = rope_rows(&x, 4, false, RopeFreqs::Base(1e4), 1.0, &offsets).expect("rope");
        let alone = |o: i32| {
            let one = mlx_rs::ops::ones::<f32>(&[1, 1, 1, 4]).expect("x");
            mlx_rs::fast::rope(&one, 4, false, 1e4, 1.0, o, None)
                .expect("rope")
                .as_slice::<f32>()
                .to_vec()
        };
        let got = y.as_slice::<f32>().to_vec();
        assert_eq!(&got[..4], alone(0).as_slice());
        assert_eq!(&got[4..], alone(3).as_slice());
        assert_ne!(&got[..4], &got[4..]);
    }
}
