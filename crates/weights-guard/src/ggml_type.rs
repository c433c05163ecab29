//! The ggml tensor types GGUF files may use, with their block geometry.
//!
//! Ids, block sizes and bytes per block are ggml's (`enum ggml_type` in
//! `ggml.h`, the `block_*` structs and their size `static_assert`s in
//! `ggml-common.h`): e.g. `block_q4_1` is two f16 plus 16 bytes of nibbles,
//! 20 bytes for 32 weights.

use std::fmt;

/// A ggml tensor type this crate knows the size of. Any other id in a GGUF
/// file is an unsupported-type error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's own spelling
pub enum GgmlType {
    /// 32-bit float (id 0).
    F32,
    /// 16-bit float (id 1).
    F16,
    /// 4-bit, one f16 scale per 32 (id 2).
    Q4_0,
    /// 4-bit, f16 scale and min per 32 (id 3).
    Q4_1,
    /// 5-bit, one f16 scale per 32 (id 6).
    Q5_0,
    /// 5-bit, f16 scale and min per 32 (id 7).
    Q5_1,
    /// 8-bit, one f16 scale per 32 (id 8).
    Q8_0,
    /// 8-bit, f16 scale and sum per 32 (id 9).
    Q8_1,
    /// 2-bit k-quant, 256 per super-block (id 10).
    Q2_K,
    /// 3-bit k-quant (id 11).
    Q3_K,
    /// 4-bit k-quant (id 12).
    Q4_K,
    /// 5-bit k-quant (id 13).
    Q5_K,
    /// 6-bit k-quant (id 14).
    Q6_K,
    /// 8-bit k-quant (id 15).
    Q8_K,
    /// 8-bit integer (id 24).
    I8,
    /// 16-bit integer (id 25).
    I16,
    /// 32-bit integer (id 26).
    I32,
    /// 64-bit integer (id 27).
    I64,
    /// 64-bit float (id 28).
    F64,
    /// bfloat16 (id 30).
    BF16,
}

impl GgmlType {
    /// Every supported type.
    pub const ALL: [Self; 20] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::BF16,
    ];

    /// The type with ggml id `id`, if supported.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// ggml's id (`enum ggml_type`).
    pub fn id(self) -> u32 {
        self.geometry().0
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.geometry().1
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.geometry().2
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q8_1 => "q8_1",
            Self::Q2_K => "q2_K",
            Self::Q3_K => "q3_K",
            Self::Q4_K => "q4_K",
            Self::Q5_K => "q5_K",
            Self::Q6_K => "q6_K",
            Self::Q8_K => "q8_K",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::F64 => "f64",
            Self::BF16 => "bf16",
        }
    }

    /// (id, elements per block, bytes per block).
    fn geometry(self) -> (u32, u64, u64) {
        match self {
            Self::F32 => (0, 1, 4),
            Self::F16 => (1, 1, 2),
            Self::Q4_0 => (2, 32, 18),
            Self::Q4_1 => (3, 32, 20),
            Self::Q5_0 => (6, 32, 22),
            Self::Q5_1 => (7, 32, 24),
            Self::Q8_0 => (8, 32, 34),
            Self::Q8_1 => (9, 32, 36),
            Self::Q2_K => (10, 256, 84),
            Self::Q3_K => (11, 256, 110),
            Self::Q4_K => (12, 256, 144),
            Self::Q5_K => (13, 256, 176),
            Self::Q6_K => (14, 256, 210),
            Self::Q8_K => (15, 256, 292),
            Self::I8 => (24, 1, 1),
            Self::I16 => (25, 1, 2),
            Self::I32 => (26, 1, 4),
            Self::I64 => (27, 1, 8),
            Self::F64 => (28, 1, 8),
            Self::BF16 => (30, 1, 2),
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlType;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_refused() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        // Removed Q4_2/Q4_3, the i-quants, IQ1_M, TQ*, MXFP4: not supported here.
        for id in [4, 5, 16, 20, 23, 29, 31, 34, 39, 40, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    /// The block sizes follow from the block layouts in ggml-common.h
    /// (`ggml_half` is 2 bytes, `QK_K` is 256, `K_SCALE_SIZE` is 12).
    #[test]
    fn block_bytes_match_the_block_layouts() {
        let half = 2;
        let qk_k = 256;
        let expected = [
            (GgmlType::Q4_0, half + 32 / 2),
            (GgmlType::Q4_1, 2 * half + 32 / 2),
            (GgmlType::Q5_0, half + 4 + 32 / 2),
            (GgmlType::Q5_1, 2 * half + 4 + 32 / 2),
            (GgmlType::Q8_0, half + 32),
            (GgmlType::Q8_1, 2 * half + 32),
            (GgmlType::Q2_K, 2 * half + qk_k / 16 + qk_k / 4),
            (GgmlType::Q3_K, half + qk_k / 4 + qk_k / 8 + 12),
            (GgmlType::Q4_K, 2 * half + 12 + qk_k / 2),
            (GgmlType::Q5_K, 2 * half + 12 + qk_k / 2 + qk_k / 8),
            (GgmlType::Q6_K, half + qk_k / 16 + 3 * qk_k / 4),
            (GgmlType::Q8_K, 4 + qk_k + qk_k / 16 * 2),
        ];
        for (t, bytes) in expected {
            assert_eq!(t.block_bytes(), bytes, "{t}");
        }
    }
}
