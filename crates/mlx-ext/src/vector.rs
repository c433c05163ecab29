//! What the float kernels ([`crate::softmax`], [`crate::swiglu`]) share: one
//! source compiled per instruction set and chosen at run time, and the
//! bit-for-bit comparison their probes and tests make against MLX.

use mlx_rs::error::Exception;
use mlx_rs::Array;

/// Defines `pub(super) fn $name($args)` running `$body` compiled for
/// AVX-512, for AVX2 (both with FMA) or for the build's baseline, whichever
/// the CPU has; the compiler vectorises each copy of the same operations.
macro_rules! vectorised {
    (fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        pub(super) fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512($($arg: $ty),*) $body
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $body
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the features `avx512` is compiled for are present.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the features `avx2` is compiled for are present.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body
        }
    };
}
pub(crate) use vectorised;

/// Whether `theirs` (an MLX result, evaluated here) holds exactly the bits
/// of `ours`: the same float32 values, NaNs and zeros' signs included.
pub(crate) fn same_bits(ours: &[f32], theirs: &Array) -> Result<bool, Exception> {
    theirs.eval()?;
    Ok(theirs.try_as_slice::<f32>().is_ok_and(|t| {
        t.len() == ours.len() && t.iter().zip(ours).all(|(a, b)| a.to_bits() == b.to_bits())
    }))
}

/// [`same_bits`] of two MLX arrays of one shape.
#[cfg(test)]
pub(crate) fn same_arrays(ours: &Array, theirs: &Array) -> Result<bool, Exception> {
    ours.eval()?;
    let ours = ours
        .try_as_slice::<f32>()
        .expect("an evaluated float32 array");
    same_bits(ours, theirs)
}
