//! A token mask applied to float32 logits on the host: refused ids set to
//! negative infinity a 32-bit word of the mask at a time, without the
//! vocabulary-wide boolean array and the MLX `select` (a scalar loop on a
//! CPU build without MLX's SIMD type) the graph would need.

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

/// `x` (`[.., V]`) with every id whose bit is clear in `allowed` (bit
/// `i % 32` of word `i / 32`; ids past the words refused) at negative
/// infinity, evaluated now: the values MLX's `select(allowed, x, -inf)`
/// gives, bit for bit. `None` where `x` is not float32 or its data cannot
/// be read as one block: the caller then selects with MLX.
pub fn refuse(x: &Array, allowed: &[u32]) -> Result<Option<Array>, Exception> {
    if x.dtype() != Dtype::Float32 || x.ndim() == 0 {
        return Ok(None);
    }
    x.eval()?;
    let Ok(input) = x.try_as_slice::<f32>() else {
        return Ok(None);
    };
    let width = x.shape().last().copied().unwrap_or(0).max(0) as usize;
    if width == 0 || input.len() % width != 0 {
        return Ok(None);
    }
    let mut out = crate::host::take_empty(input.len());
    for row in input.chunks(width) {
        refuse_row(row, allowed, &mut out);
    }
    Ok(Some(crate::host::hand_over(out, x.shape())))
}

/// Appends one masked row to `out`: whole words refused or allowed at once
/// (most of a grammar's mask), the others bit by bit.
fn refuse_row(row: &[f32], allowed: &[u32], out: &mut Vec<f32>) {
    for (i, chunk) in row.chunks(32).enumerate() {
        match allowed.get(i).copied().unwrap_or(0) {
            0 => out.extend(std::iter::repeat_n(f32::NEG_INFINITY, chunk.len())),
            u32::MAX => out.extend_from_slice(chunk),
            word => out.extend(chunk.iter().enumerate().map(|(bit, &v)| {
                if (word >> bit) & 1 != 0 {
                    v
                } else {
                    f32::NEG_INFINITY
                }
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vector::same_bits;
    use mlx_rs::ops::indexing::IndexOp;
    use mlx_rs::ops::select;

    /// Ours equals MLX's `select` bit for bit: rows of two widths (one off
    /// the word size), words all clear, all set and mixed, fewer words than
    /// the row (the rest refused), NaN and infinities among the logits.
    #[test]
    fn refuse_gives_mlx_select_bits() -> Result<(), Exception> {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for (rows, width) in [(1usize, 200usize), (3, 96)] {
            let mut values: Vec<f32> = (0..rows * width)
                .map(|_| next() as f32 / u32::MAX as f32 * 40.0 - 20.0)
                .collect();
            values[5] = f32::NAN;
            values[7] = f32::INFINITY;
            values[9] = f32::NEG_INFINITY;
            let x = Array::from_slice(&values, &[rows as i32, width as i32]);
            let words: Vec<u32> = (0..width.div_ceil(32) - 1)
                .map(|i| match i % 3 {
                    0 => 0,
                    1 => u32::MAX,
                    _ => next() | 0x2a0,
                })
                .collect();
            let flags: Vec<bool> = (0..width)
                .map(|i| words.get(i / 32).is_some_and(|w| (w >> (i % 32)) & 1 != 0))
                .collect();
            let refused = Array::from_f32(f32::NEG_INFINITY);
            let theirs = select(Array::from_slice(&flags, &[width as i32]), &x, &refused)?;
            let ours = refuse(&x, &words)?.expect("float32 rows");
            ours.eval()?;
            let ours = ours.try_as_slice::<f32>().expect("f32");
            assert!(same_bits(ours, &theirs)?, "{rows} x {width}");
        }
        // One position of a verify window's logits (a view into them), as
        // the serve loop masks it.
        let window: Vec<f32> = (0..3 * 40).map(|i| i as f32).collect();
        let window = Array::from_slice(&window, &[1, 3, 40]);
        window.eval()?;
        let row = window.index((.., 1, ..));
        let masked = refuse(&row, &[0b1010, 0x80])?.expect("a window's row on the host");
        let kept: Vec<f32> = masked
            .as_slice::<f32>()
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        assert_eq!(kept, [41.0, 43.0, 79.0]);
        let half = Array::from_slice(&[1.0f32, 2.0], &[1, 2]).as_dtype(Dtype::Float16)?;
        assert!(refuse(&half, &[1])?.is_none(), "float32 only");
        Ok(())
    }
}
