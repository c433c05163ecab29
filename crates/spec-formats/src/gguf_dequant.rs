//! ggml's tensor types dequantized to float32 exactly as ggml computes them
//! (and as `gguf.quants.dequantize`, ggml's reference Python port, does):
//! the block's float16 scales widened to float32 first, then one rounding per
//! multiply and per add, in ggml's order. MLX's own GGUF reader keeps scales
//! in float16 (Q4_0/Q4_1/Q8_0), folds k-quant scales in float16 (Q4_K) or
//! rounds whole tensors to float16 (the other types), which changes weights by
//! up to 2^-8; this module is what the loader uses instead.

use half::f16;
use weights_guard::GgmlType;

pub(crate) fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Whether `dequantize` handles tensors of this type.
pub fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

/// Dequantizes `count` elements of type `ty` stored in `data`; `None` when
/// the type is not supported or `data` does not hold exactly `count`
/// elements.
pub fn dequantize(ty: GgmlType, data: &[u8], count: usize) -> Option<Vec<f32>> {
    let block = ty.block_size() as usize;
    let bytes = ty.block_bytes() as usize;
    if !supported(ty)
        || block == 0
        || !count.is_multiple_of(block)
        || data.len() != count / block * bytes
    {
        return None;
    }
    let mut out = vec![0.0_f32; count];
    for (src, dst) in data.chunks_exact(bytes).zip(out.chunks_exact_mut(block)) {
        match ty {
            GgmlType::F32 => dst[0] = f32::from_le_bytes([src[0], src[1], src[2], src[3]]),
            GgmlType::F16 => dst[0] = half(src, 0),
            GgmlType::BF16 => {
                dst[0] = f32::from_bits(u32::from(u16::from_le_bytes([src[0], src[1]])) << 16)
            }
            GgmlType::Q4_0 => q4_0(src, dst),
            GgmlType::Q4_1 => q4_1(src, dst),
            GgmlType::Q5_0 => q5_0(src, dst),
            GgmlType::Q5_1 => q5_1(src, dst),
            GgmlType::Q8_0 => q8_0(src, dst),
            GgmlType::Q2_K => q2_k(src, dst),
            GgmlType::Q3_K => q3_k(src, dst),
            GgmlType::Q4_K => q4_k(src, dst),
            GgmlType::Q5_K => q5_k(src, dst),
            GgmlType::Q6_K => q6_k(src, dst),
            _ => return None,
        }
    }
    Some(out)
}

/// The 4-bit value `i` of 32 packed as 16 bytes: low nibbles first, then high.
pub(crate) fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < 16 {
        qs[i] & 0x0F
    } else {
        qs[i - 16] >> 4
    }
}

fn q4_0(src: &[u8], dst: &mut [f32]) {
    let d = half(src, 0);
    for (i, y) in dst.iter_mut().enumerate() {
        *y = d * f32::from(nibble(&src[2..], i) as i8 - 8);
    }
}

fn q4_1(src: &[u8], dst: &mut [f32]) {
    let (d, m) = (half(src, 0), half(src, 2));
    for (i, y) in dst.iter_mut().enumerate() {
        *y = d * f32::from(nibble(&src[4..], i)) + m;
    }
}

/// The 5-bit value `i`: a nibble plus bit `i` of the 32-bit high mask.
pub(crate) fn five_bits(qh: &[u8], qs: &[u8], i: usize) -> u8 {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibble(qs, i) | ((((high >> i) & 1) as u8) << 4)
}

fn q5_0(src: &[u8], dst: &mut [f32]) {
    let d = half(src, 0);
    for (i, y) in dst.iter_mut().enumerate() {
        *y = d * f32::from(five_bits(&src[2..6], &src[6..], i) as i8 - 16);
    }
}

fn q5_1(src: &[u8], dst: &mut [f32]) {
    let (d, m) = (half(src, 0), half(src, 2));
    for (i, y) in dst.iter_mut().enumerate() {
        *y = d * f32::from(five_bits(&src[4..8], &src[8..], i)) + m;
    }
}

fn q8_0(src: &[u8], dst: &mut [f32]) {
    let d = half(src, 0);
    for (i, y) in dst.iter_mut().enumerate() {
        *y = f32::from(src[2 + i] as i8) * d;
    }
}

/// Element `e` of a super-block whose 2-bit values are packed four to a byte
/// over two halves of 32 bytes: byte `half * 32 + l`, shift `2 * s`.
fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (half, s, l) = (e / 128, (e % 128) / 32, e % 32);
    (qs[half * 32 + l] >> (2 * s)) & 3
}

fn q2_k(src: &[u8], dst: &mut [f32]) {
    let (scales, qs) = (&src[..16], &src[16..80]);
    let (d, dmin) = (half(src, 80), half(src, 82));
    for (e, y) in dst.iter_mut().enumerate() {
        let sc = scales[e / 16];
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        *y = dl * f32::from(two_bits(qs, e)) - ml;
    }
}

fn q3_k(src: &[u8], dst: &mut [f32]) {
    let (hmask, qs, packed) = (&src[..32], &src[32..96], &src[96..108]);
    let d = half(src, 108);
    let scale = |i: usize| -> f32 {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        f32::from((low | (high << 4)) as i8 - 32)
    };
    for (e, y) in dst.iter_mut().enumerate() {
        let dl = d * scale(e / 16);
        // A set mask bit means no offset; a clear one subtracts 4.
        let h = ((hmask[e % 32] >> (e / 32)) & 1) ^ 1;
        let q = two_bits(qs, e) as i8 - ((h << 2) as i8);
        *y = dl * f32::from(q);
    }
}

/// Q4_K / Q5_K's eight 6-bit scales and mins packed in 12 bytes.
pub(crate) fn scale_min(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 0x3F, packed[4 + j] & 0x3F)
    } else {
        let k = j - 4;
        (
            (packed[8 + k] & 0x0F) | ((packed[k] >> 2) & 0x30),
            (packed[8 + k] >> 4) | ((packed[4 + k] >> 2) & 0x30),
        )
    }
}

/// Element `e` of 256 whose nibbles are packed as four chunks of 32 bytes,
/// low nibbles of a chunk first.
pub(crate) fn k_nibble(qs: &[u8], e: usize) -> u8 {
    let (j, l) = (e / 32, e % 32);
    (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0F
}

fn q4_k(src: &[u8], dst: &mut [f32]) {
    let (d, dmin) = (half(src, 0), half(src, 2));
    let (packed, qs) = (&src[4..16], &src[16..144]);
    for (e, y) in dst.iter_mut().enumerate() {
        let (sc, m) = scale_min(packed, e / 32);
        *y = (d * f32::from(sc)) * f32::from(k_nibble(qs, e)) - dmin * f32::from(m);
    }
}

fn q5_k(src: &[u8], dst: &mut [f32]) {
    let (d, dmin) = (half(src, 0), half(src, 2));
    let (packed, qh, qs) = (&src[4..16], &src[16..48], &src[48..176]);
    for (e, y) in dst.iter_mut().enumerate() {
        let (sc, m) = scale_min(packed, e / 32);
        let q = k_nibble(qs, e) | (((qh[e % 32] >> (e / 32)) & 1) << 4);
        *y = (d * f32::from(sc)) * f32::from(q) - dmin * f32::from(m);
    }
}

fn q6_k(src: &[u8], dst: &mut [f32]) {
    let (ql, qh, scales) = (&src[..128], &src[128..192], &src[192..208]);
    let d = half(src, 208);
    for (e, y) in dst.iter_mut().enumerate() {
        let (half_, rest) = (e / 128, e % 128);
        let low = (ql[half_ * 64 + rest % 64] >> (4 * (rest / 64))) & 0x0F;
        let high = (qh[half_ * 32 + rest % 32] >> (2 * (rest / 32))) & 0x03;
        let q = (low | (high << 4)) as i8 - 32;
        *y = (d * f32::from(scales[e / 16] as i8)) * f32::from(q);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q4_1_is_computed_in_float32() {
        // d = 0.1 and m = -0.3 in float16; q = 0..31 nibble pattern.
        let mut block = Vec::new();
        block.extend(h(0.1));
        block.extend(h(-0.3));
        block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let got = dequantize(GgmlType::Q4_1, &block, 32).expect("q4_1");
        let (d, m) = (f16::from_f32(0.1).to_f32(), f16::from_f32(-0.3).to_f32());
        assert_eq!(got[0], d * 0.0 + m);
        assert_eq!(got[3], d * 3.0 + m);
        assert_eq!(got[16], d * 15.0 + m);
        assert_eq!(got[31], d * 0.0 + m);
    }

    #[test]
    fn sizes_that_do_not_fit_the_type_are_refused() {
        assert!(dequantize(GgmlType::Q4_0, &[0; 18], 31).is_none());
        assert!(dequantize(GgmlType::Q4_0, &[0; 17], 32).is_none());
        assert!(dequantize(GgmlType::Q8_1, &[0; 36], 32).is_none());
        assert_eq!(
            dequantize(GgmlType::Q8_0, &[0; 34], 32).map(|v| v.len()),
            Some(32)
        );
        assert_eq!(
            dequantize(GgmlType::Q6_K, &[0; 210], 256).map(|v| v.len()),
            Some(256)
        );
    }
}
