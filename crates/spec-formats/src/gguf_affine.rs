//! ggml's block types whose values MLX's affine quantization (groups of 32,
//! `scale * q + bias`) holds exactly, re-laid as MLX packs them: per group
//! of 32 values, `bits` little-endian `u32` words of one bit stream (value
//! `i` at bit `i * bits`), one scale and one bias.
//!
//! Each block's `scale * q + bias` is ggml's own value (bit for bit, but
//! that a zero ggml computes as a negative scale times zero is +0.0): ggml
//! widens its float16 fields to float32, and every product it forms (a
//! float16 times a 6-bit scale, times a value of at most 8 bits) is exact in
//! float32, so the one rounding left (the add) is the same on both sides.
//! Q4_0, Q5_0 and Q8_0 store signed values `d * (q - k)`: unsigned `q` with
//! bias `-k * d`. Q4_K and Q5_K split a 256-value super-block into eight
//! groups of 32 with 6-bit scales and mins: scale `d * sc`, bias
//! `-(dmin * m)`. Scales and biases are float32: in float16 MLX would
//! dequantize in float16 (its result takes the scales' dtype), rounding
//! what ggml computes in float32. Q2_K, Q3_K and Q6_K scale groups of 16,
//! which MLX's smallest group (32) cannot hold: those stay float.

use weights_guard::GgmlType;

use crate::gguf_dequant::{five_bits, half, k_nibble, nibble, scale_min};

/// A tensor in MLX's affine layout, group size 32.
#[derive(Debug, Clone, PartialEq)]
pub struct Affine {
    /// Bits per value.
    pub bits: i32,
    /// The packed values, `bits` words per group.
    pub words: Vec<u32>,
    /// One per group.
    pub scales: Vec<f32>,
    /// One per group.
    pub biases: Vec<f32>,
}

/// The bits per value MLX holds a tensor of type `ty` in, if it can hold it
/// exactly.
pub fn bits(ty: GgmlType) -> Option<i32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => Some(4),
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => Some(5),
        GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

/// Re-lays `count` values of type `ty` stored in `data`; `None` when the
/// type has no exact affine form ([`bits`]) or `data` does not hold exactly
/// `count` values.
pub fn repack(ty: GgmlType, data: &[u8], count: usize) -> Option<Affine> {
    let bits = bits(ty)?;
    let block = ty.block_size() as usize;
    let bytes = ty.block_bytes() as usize;
    if block == 0 || !count.is_multiple_of(block) || data.len() != count / block * bytes {
        return None;
    }
    let groups = count / 32;
    let mut out = Affine {
        bits,
        words: Vec::with_capacity(groups * bits as usize),
        scales: Vec::with_capacity(groups),
        biases: Vec::with_capacity(groups),
    };
    for src in data.chunks_exact(bytes) {
        match ty {
            GgmlType::Q4_0 => {
                let d = half(src, 0);
                out.push(d, -8.0 * d, |i| nibble(&src[2..], i));
            }
            GgmlType::Q4_1 => {
                out.push(half(src, 0), half(src, 2), |i| nibble(&src[4..], i));
            }
            GgmlType::Q5_0 => {
                let d = half(src, 0);
                out.push(d, -16.0 * d, |i| five_bits(&src[2..6], &src[6..], i));
            }
            GgmlType::Q5_1 => {
                let (d, m) = (half(src, 0), half(src, 2));
                out.push(d, m, |i| five_bits(&src[4..8], &src[8..], i));
            }
            GgmlType::Q8_0 => {
                let d = half(src, 0);
                out.push(d, -128.0 * d, |i| (src[2 + i] as i8 as i16 + 128) as u8);
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (half(src, 0), half(src, 2));
                let packed = &src[4..16];
                for g in 0..8 {
                    let (sc, m) = scale_min(packed, g);
                    let value = |i: usize| {
                        let e = g * 32 + i;
                        if ty == GgmlType::Q4_K {
                            k_nibble(&src[16..144], e)
                        } else {
                            let high = (src[16 + e % 32] >> (e / 32)) & 1;
                            k_nibble(&src[48..176], e) | (high << 4)
                        }
                    };
                    out.push(d * f32::from(sc), -(dmin * f32::from(m)), value);
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

impl Affine {
    /// Appends one group of 32 values.
    fn push(&mut self, scale: f32, bias: f32, value: impl Fn(usize) -> u8) {
        let bits = self.bits as usize;
        let mut words = [0_u32; 8];
        for i in 0..32 {
            let q = u64::from(value(i)) << ((i * bits) % 32);
            let at = i * bits / 32;
            words[at] |= q as u32;
            if at + 1 < bits {
                words[at + 1] |= (q >> 32) as u32;
            }
        }
        self.words.extend_from_slice(&words[..bits]);
        self.scales.push(scale);
        self.biases.push(bias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf_dequant::dequantize;
    use half::f16;
    use mlx_ext::quant::{Packed, QuantParams};
    use mlx_rs::Array;

    /// Random blocks of `ty` whose float16 fields are finite and small.
    fn blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let bytes = ty.block_bytes() as usize;
        let n = rows * cols / ty.block_size() as usize;
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        };
        let mut data: Vec<u8> = (0..n * bytes).map(|_| next()).collect();
        let halves: &[usize] = match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            _ => &[0],
        };
        for (b, block) in data.chunks_exact_mut(bytes).enumerate() {
            for (k, &at) in halves.iter().enumerate() {
                let v = f16::from_f32(((b * 7 + k * 3) % 13) as f32 * 0.003 - 0.017);
                block[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        data
    }

    /// MLX's `dequantize` of our repacked blocks equals ggml's values (as
    /// `gguf_dequant`, gated against `gguf.quants.dequantize`), bit for bit
    /// but the sign of zeros.
    #[test]
    fn mlx_dequantizes_the_repacked_blocks_to_ggmls_values() {
        let (rows, cols) = (3, 512);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
        ] {
            let data = blocks(ty, rows, cols, ty as u64 + 1);
            let want = dequantize(ty, &data, rows * cols).expect("dequantize");
            let a = repack(ty, &data, rows * cols).expect("repack");
            let bits = a.bits;
            let g = (cols / 32) as i32;
            let packed = Packed::from_parts(
                Array::from_slice(&a.words, &[rows as i32, g * bits]),
                Array::from_slice(&a.scales, &[rows as i32, g]),
                Some(Array::from_slice(&a.biases, &[rows as i32, g])),
                QuantParams::affine(32, bits),
            )
            .expect("packed");
            let got = packed.dequantize().expect("mlx dequantize");
            let got = got.as_slice::<f32>();
            // Equal as numbers: where ggml's `d * (q - 8)` is a negative
            // scale times zero (-0.0), `d * 8 + (-8 * d)` is +0.0.
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(first, None, "{ty}: {:?}", first.map(|i| (got[i], want[i])));
            let equal_bits = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0));
            assert!(equal_bits, "{ty}");
        }
    }

    #[test]
    fn types_mlx_cannot_hold_and_wrong_sizes_are_refused() {
        for ty in [
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::F32,
        ] {
            assert!(repack(ty, &[0; 210], 256).is_none(), "{ty}");
        }
        assert!(repack(GgmlType::Q4_0, &[0; 17], 32).is_none());
        assert!(repack(GgmlType::Q4_K, &[0; 144], 255).is_none());
        assert_eq!(
            repack(GgmlType::Q4_K, &[0; 144], 256).map(|a| a.words.len()),
            Some(8 * 4)
        );
    }
}
