//! MLX's precise float32 softmax over the last axis, with the CPU's vector
//! units.
//!
//! Where MLX's CPU backend has no SIMD type for float32 (its x86_64 and
//! Linux aarch64 builds: `simd::max_size` is 1) its softmax walks each row
//! one float at a time: the maximum; `exp(x - max)`, a power of two times a
//! degree-6 polynomial evaluated with fused multiply-adds; the sum of those
//! left to right; one reciprocal; the products. The polynomial's library
//! `fmaf` calls cost ~16 ns a float on an x86 server core, and attention
//! over a few thousand keys spends most of its time there.
//!
//! [`softmax`] runs the same operations on each element in the same order,
//! eight or sixteen elements at a time (each row's sum stays one
//! left-to-right chain), so its bits are MLX's. A probe compares the two
//! once per process on awkward rows; where they differ (Accelerate on macOS,
//! another MLX) MLX's op runs.

use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::ops::softmax_axis;
use mlx_rs::{Array, Dtype};

use crate::vector::same_bits;

/// Rows of at least this many elements in all are split between threads
/// (one thread does about a float a nanosecond; starting and joining two
/// costs ~0.1 ms).
const PARALLEL_ELEMENTS: usize = 1 << 19;

/// MLX's float32 `exp` (`simd::exp` in its CPU backend), one element:
/// `2^round(y) * p(y - round(y))` for `y = x * log2(e)` rounded half up,
/// `p` the Cephes polynomial; NaN kept, `inf` above 88, `0` below -88.
#[inline(always)]
// The literals exactly as MLX writes them (`1.442695f` is its log2(e)).
#[allow(clippy::excessive_precision, clippy::approx_constant)]
pub fn exp(x: f32) -> f32 {
    let y = x * 1.442695_f32;
    // MLX adds 0.5 in double precision, so `floor(y + 0.5)` is exact.
    let low = y.floor();
    let ipart = if y - low >= 0.5 { low + 1.0 } else { low };
    let f = y - ipart;
    let mut p = 1.535336188319500e-4_f32;
    p = p.mul_add(f, 1.339887440266574e-3);
    p = p.mul_add(f, 9.618437357674640e-3);
    p = p.mul_add(f, 5.550332471162809e-2);
    p = p.mul_add(f, 2.402264791363012e-1);
    p = p.mul_add(f, 6.931472028550421e-1);
    p = p.mul_add(f, 1.0);
    // Past ±128 (and for NaN) the result is replaced below; bounding keeps
    // the conversion a plain vector instruction. Not `clamp`: it keeps NaN,
    // and `max` turns NaN into -128.
    #[allow(clippy::manual_clamp)]
    let bounded = ipart.max(-128.0).min(128.0);
    // SAFETY: `bounded` is finite and within i32.
    let whole = unsafe { bounded.to_int_unchecked::<i32>() };
    let power = f32::from_bits((whole.wrapping_add(127) as u32).wrapping_shl(23));
    let out = if x.is_nan() { x } else { power * p };
    let out = if x > 88.0 { f32::INFINITY } else { out };
    if x < -88.0 {
        0.0
    } else {
        out
    }
}

/// The softmax of each `width`-long row of `input` into `out`, bit for bit
/// MLX's precise float32 softmax on a CPU without its SIMD type; rows are
/// split between threads when there are many.
///
/// # Panics
/// If `out` is not as long as `input` or `width` does not divide it.
pub fn softmax_rows(input: &[f32], width: usize, out: &mut [f32]) {
    split_rows(input, width, out, kernel::softmax);
}

/// `x - logsumexp(x)` of each `width`-long row of `input` into `out`, bit
/// for bit MLX's `logsumexp` (float32, last axis) and subtraction.
///
/// # Panics
/// As [`softmax_rows`].
pub fn log_softmax_rows(input: &[f32], width: usize, out: &mut [f32]) {
    split_rows(input, width, out, kernel::log_softmax);
}

fn split_rows(input: &[f32], width: usize, out: &mut [f32], rows: fn(&[f32], usize, &mut [f32])) {
    assert_eq!(input.len(), out.len(), "softmax: input and output lengths");
    if input.is_empty() || width == 0 {
        return;
    }
    assert_eq!(input.len() % width, 0, "softmax: rows of {width}");
    let count = input.len() / width;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(count)
        .min(input.len().div_ceil(PARALLEL_ELEMENTS));
    if threads <= 1 {
        rows(input, width, out);
        return;
    }
    let per = count.div_ceil(threads) * width;
    std::thread::scope(|scope| {
        for (src, dst) in input.chunks(per).zip(out.chunks_mut(per)) {
            scope.spawn(move || rows(src, width, dst));
        }
    });
}

/// `softmax(x, axis=-1, precise=True)` as MLX computes it, evaluated now:
/// with [`softmax_rows`] where that gives MLX's bits (float32, a row-major
/// array, the probe passed on this machine), else with MLX's op (lazily).
pub fn softmax(x: &Array) -> Result<Array, Exception> {
    match eager(x, softmax_rows)? {
        Some(out) => Ok(out),
        None => Ok(softmax_axis(x, -1, true)?),
    }
}

/// `x - logsumexp(x, axis=-1, keepdims=True)` as MLX computes it, evaluated
/// now with [`log_softmax_rows`] where that gives MLX's bits, else with
/// MLX's ops (lazily).
pub fn log_softmax(x: &Array) -> Result<Array, Exception> {
    match eager(x, log_softmax_rows)? {
        Some(out) => Ok(out),
        None => Ok(x.subtract(x.logsumexp_axis(-1, true)?)?),
    }
}

/// `rows` over `x`'s last axis, or `None` where MLX's ops must run.
fn eager(x: &Array, rows: fn(&[f32], usize, &mut [f32])) -> Result<Option<Array>, Exception> {
    if x.dtype() != Dtype::Float32 || x.ndim() == 0 || !matches_mlx() {
        return Ok(None);
    }
    x.eval()?;
    let Ok(input) = x.try_as_slice::<f32>() else {
        return Ok(None);
    };
    let width = x.shape().last().copied().unwrap_or(1).max(0) as usize;
    let mut out = crate::host::take(input.len());
    rows(input, width, &mut out);
    Ok(Some(crate::host::hand_over(out, x.shape())))
}

/// Whether [`softmax_rows`] gives MLX's bits on this machine: checked once
/// per process on rows with large and tiny spreads, masked entries (the
/// lowest finite float, `-inf`), a fully masked row, exponents past the
/// ±88 cut-offs, and a NaN.
pub fn matches_mlx() -> bool {
    static MATCHES: OnceLock<bool> = OnceLock::new();
    *MATCHES.get_or_init(|| probe().unwrap_or(false))
}

fn probe() -> Result<bool, Exception> {
    let width = 67;
    let mut rows: Vec<f32> = Vec::new();
    let mut seed = 0x2545_f491_u32;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed as f32 / u32::MAX as f32 - 0.5
    };
    for spread in [0.01_f32, 1.0, 8.0, 60.0, 200.0, 3e4] {
        rows.extend((0..width).map(|_| next() * spread));
    }
    rows.extend((0..width).map(|i| if i % 3 == 0 { f32::MIN } else { next() * 4.0 }));
    rows.extend((0..width).map(|i| if i > 40 { f32::NEG_INFINITY } else { next() }));
    rows.extend(std::iter::repeat_n(f32::MIN, width));
    rows.extend((0..width).map(|i| if i == 7 { f32::NAN } else { next() }));
    let shape = [(rows.len() / width) as i32, width as i32];
    let x = Array::from_slice(&rows, &shape);
    let probs = softmax_axis(&x, -1, true)?;
    let logs = x.subtract(x.logsumexp_axis(-1, true)?)?;
    let (mut soft, mut log) = (vec![0.0_f32; rows.len()], vec![0.0_f32; rows.len()]);
    softmax_rows(&rows, width, &mut soft);
    log_softmax_rows(&rows, width, &mut log);
    Ok(same_bits(&soft, &probs)? && same_bits(&log, &logs)?)
}

/// The row kernel, compiled once per instruction set and chosen at run
/// time; every version computes the same operations in the same order.
mod kernel {
    use super::exp;

    /// Rows processed together so their sums' add chains overlap.
    const GROUP: usize = 4;

    /// Each row's maximum, `exp(x - max)` into `out`, the sums of those
    /// left to right (rows in groups, so the add chains overlap), then
    /// `finish(row, out_row, max, sum)`.
    #[inline(always)]
    fn generic(
        input: &[f32],
        width: usize,
        out: &mut [f32],
        finish: impl Fn(&[f32], &mut [f32], f32, f32),
    ) {
        for (src, dst) in input
            .chunks(width * GROUP)
            .zip(out.chunks_mut(width * GROUP))
        {
            let n = src.len() / width;
            let mut maxes = [0.0_f32; GROUP];
            for r in 0..n {
                let row = &src[r * width..(r + 1) * width];
                let max = row_max(row);
                maxes[r] = max;
                for (d, s) in dst[r * width..(r + 1) * width].iter_mut().zip(row) {
                    *d = exp(*s - max);
                }
            }
            let mut sums = [0.0_f32; GROUP];
            if n == GROUP {
                for j in 0..width {
                    for (r, sum) in sums.iter_mut().enumerate() {
                        *sum += dst[r * width + j];
                    }
                }
            } else {
                for (r, sum) in sums.iter_mut().enumerate().take(n) {
                    for v in &dst[r * width..(r + 1) * width] {
                        *sum += *v;
                    }
                }
            }
            for r in 0..n {
                let span = r * width..(r + 1) * width;
                finish(&src[span.clone()], &mut dst[span], maxes[r], sums[r]);
            }
        }
    }

    /// Softmax: the exponentials times the sum's reciprocal.
    #[inline(always)]
    fn normalize(_: &[f32], out: &mut [f32], _: f32, sum: f32) {
        let scale = 1.0 / sum;
        for d in out {
            *d *= scale;
        }
    }

    /// Log-softmax: the input minus `logsumexp`, which is `log(sum) + max`
    /// unless the maximum is infinite (then the maximum itself).
    #[inline(always)]
    fn subtract_log_sum(row: &[f32], out: &mut [f32], max: f32, sum: f32) {
        let lse = if max.is_infinite() {
            max
        } else {
            sum.ln() + max
        };
        for (d, s) in out.iter_mut().zip(row) {
            *d = *s - lse;
        }
    }

    /// The largest element, or NaN when there is one (as MLX's
    /// `maximum`, which keeps a NaN once met). The order of comparisons
    /// does not matter: only equal values or zeros of either sign tie, and
    /// `exp(x - max)` is the same for both zeros.
    #[inline(always)]
    fn row_max(row: &[f32]) -> f32 {
        const LANES: usize = 16;
        let mut max = [f32::NEG_INFINITY; LANES];
        let mut nan = [0_u32; LANES];
        let chunks = row.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for i in 0..LANES {
                let v = chunk[i];
                nan[i] |= u32::from(v.is_nan());
                max[i] = if v > max[i] { v } else { max[i] };
            }
        }
        let mut out = f32::NEG_INFINITY;
        let mut any_nan = nan.iter().any(|n| *n != 0);
        for v in max.iter().chain(tail) {
            any_nan |= v.is_nan();
            out = if *v > out { *v } else { out };
        }
        if any_nan {
            f32::NAN
        } else {
            out
        }
    }

    crate::vector::vectorised! {
        fn softmax(input: &[f32], width: usize, out: &mut [f32]) {
            generic(input, width, out, normalize)
        }
    }

    crate::vector::vectorised! {
        fn log_softmax(input: &[f32], width: usize, out: &mut [f32]) {
            generic(input, width, out, subtract_log_sum)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our `exp` equals MLX's on every 61st float32 bit pattern (all
    /// signs, exponents and NaNs included) and on every float in the range
    /// attention scores take after the maximum is subtracted.
    #[test]
    fn exp_gives_mlx_bits() -> Result<(), Exception> {
        let mut xs: Vec<f32> = (0..u32::MAX / 61).map(|i| f32::from_bits(i * 61)).collect();
        let (lo, hi) = ((-90.0_f32).to_bits(), (-0.0_f32).to_bits());
        xs.extend((hi..=lo).step_by(7).map(f32::from_bits));
        for chunk in xs.chunks(1 << 22) {
            let theirs = mlx_rs::ops::exp(Array::from_slice(chunk, &[chunk.len() as i32]))?;
            theirs.eval()?;
            let theirs = theirs.try_as_slice::<f32>().expect("evaluated f32");
            for (x, t) in chunk.iter().zip(theirs) {
                assert_eq!(
                    exp(*x).to_bits(),
                    t.to_bits(),
                    "exp({x:e}) ({:#x})",
                    x.to_bits()
                );
            }
        }
        Ok(())
    }

    /// Rows of attention-like scores and of a vocabulary's logits: ours
    /// equal MLX's ops bit for bit, one row and many (threads), widths off
    /// the vector length.
    #[test]
    fn softmax_gives_mlx_bits() -> Result<(), Exception> {
        assert!(matches_mlx(), "the probe failed on this machine");
        let key = mlx_rs::random::key(11)?;
        for shape in [
            [1, 1, 1],
            [1, 9, 301],
            [2, 37, 1500],
            [3, 3, 17],
            [1, 12, 49152],
        ] {
            let x = mlx_rs::random::normal::<f32>(&shape, None, Some(6.0), &key)?;
            let pairs = [
                (softmax(&x)?, softmax_axis(&x, -1, true)?),
                (log_softmax(&x)?, x.subtract(x.logsumexp_axis(-1, true)?)?),
            ];
            for (kind, (ours, theirs)) in ["softmax", "log-softmax"].iter().zip(&pairs) {
                assert_eq!(ours.shape(), theirs.shape());
                assert!(
                    crate::vector::same_arrays(ours, theirs)?,
                    "{kind} {shape:?}: bits differ"
                );
            }
        }
        Ok(())
    }
}
