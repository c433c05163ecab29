//! `QuantizedKvCache`: keys and values stored quantized (MLX's affine mode,
//! groups along the head dimension), as mlx-lm's `QuantizedKVCache` keeps
//! them (`--kv-bits`, `--kv-group-size`). Each position's row is quantized
//! on its own, so what the cache holds does not depend on how the tokens
//! arrived (prompt chunks, verify windows, rolled-back drafts); attention
//! reads it through `sdpa::quantized_attention`.

use mlx_ext::quant::{Packed, QuantParams, AFFINE_BITS, AFFINE_GROUP_SIZES};
use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

use super::buffer::Rows;

/// The bits and group size of a quantized KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuantization {
    /// Bits per element.
    pub bits: i32,
    /// Elements of the head dimension sharing a scale and a bias.
    pub group_size: i32,
}

/// Why a KV quantization cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvQuantizationError {
    /// Bits MLX's affine mode does not offer.
    #[error("--kv-bits {0}: MLX's affine quantization takes {AFFINE_BITS:?}")]
    Bits(i32),
    /// A group size MLX's affine mode does not offer.
    #[error("--kv-group-size {0}: MLX's affine quantization takes {AFFINE_GROUP_SIZES:?}")]
    GroupSize(i32),
}

impl KvQuantization {
    /// mlx-lm's default group size (`--kv-group-size`).
    pub const DEFAULT_GROUP_SIZE: i32 = 64;

    /// `bits` with `group_size`, if MLX's affine mode takes them.
    pub fn new(bits: i32, group_size: i32) -> Result<Self, KvQuantizationError> {
        if !AFFINE_BITS.contains(&bits) {
            return Err(KvQuantizationError::Bits(bits));
        }
        if !AFFINE_GROUP_SIZES.contains(&group_size) {
            return Err(KvQuantizationError::GroupSize(group_size));
        }
        Ok(Self { bits, group_size })
    }

    /// A load option error unless the group size divides `head_dim`
    /// (keys' and values' last dimension).
    pub fn check_head_dim(self, head_dim: i32) -> Result<Self, crate::ModelError> {
        if head_dim % self.group_size == 0 {
            Ok(self)
        } else {
            Err(crate::ModelError::LoadOption {
                option: "--kv-group-size",
                message: format!(
                    "{} does not divide the model's head dimension {head_dim}",
                    self.group_size
                ),
            })
        }
    }

    /// MLX's parameters.
    pub fn params(self) -> QuantParams {
        QuantParams::affine(self.group_size, self.bits)
    }
}

/// Keys and values of every position, quantized: six arrays
/// `[B, heads, T, ..]` in lockstep (keys' packed words, scales and biases,
/// then the values'), grown in mlx-lm's steps and trimmed exactly.
#[derive(Debug, Clone)]
pub struct QuantizedKvCache {
    quantization: KvQuantization,
    rows: Rows<6>,
}

/// A quantization op's error as the cache interface's.
fn quant_error(e: mlx_ext::quant::QuantError) -> SpecError {
    SpecError::Model(Box::new(e))
}

impl QuantizedKvCache {
    /// An empty cache.
    pub fn new(quantization: KvQuantization) -> Self {
        Self {
            quantization,
            rows: Rows::default(),
        }
    }

    /// Its bits and group size.
    pub fn quantization(&self) -> KvQuantization {
        self.quantization
    }

    /// What a file records it as.
    fn kind(&self) -> CacheKind {
        CacheKind::Quantized {
            bits: self.quantization.bits,
            group_size: self.quantization.group_size,
        }
    }

    /// Quantizes this step's keys and values (`[B, heads, L, D]`), appends
    /// them and returns every position's, packed.
    pub fn update_and_fetch_packed(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Packed, Packed), SpecError> {
        let params = self.quantization.params();
        let k = Packed::quantize(keys, params).map_err(quant_error)?;
        let v = Packed::quantize(values, params).map_err(quant_error)?;
        let (kw, ks, kb) = k.into_parts();
        let (vw, vs, vb) = v.into_parts();
        let (Some(kb), Some(vb)) = (kb, vb) else {
            return Err(SpecError::Internal("affine quantization without biases"));
        };
        let all = self.rows.append([&kw, &ks, &kb, &vw, &vs, &vb])?;
        self.packed(all)
    }

    /// Appends this step's keys and values (`[B, kv, L, D]`, after RoPE)
    /// and attends `queries` (`[B, heads, L, D]`, the window's last `L`
    /// positions) over every position, causally within the window:
    /// `[B, heads, L, D]`.
    pub fn attend(
        &mut self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
    ) -> Result<Array, crate::ModelError> {
        let (keys, values) = self.update_and_fetch_packed(keys, values)?;
        let mask = if queries.dim(2) > 1 {
            crate::sdpa::Mask::Causal
        } else {
            crate::sdpa::Mask::None
        };
        crate::sdpa::quantized_attention(queries, &keys, &values, scale, mask)
    }

    /// Keys and values from the six arrays.
    fn packed(&self, all: [Array; 6]) -> Result<(Packed, Packed), SpecError> {
        let params = self.quantization.params();
        let [kw, ks, kb, vw, vs, vb] = all;
        let keys = Packed::from_parts(kw, ks, Some(kb), params).map_err(quant_error)?;
        let values = Packed::from_parts(vw, vs, Some(vb), params).map_err(quant_error)?;
        Ok((keys, values))
    }

    /// The valid positions, dequantized.
    fn dequantized(&self) -> Result<Option<(Array, Array)>, SpecError> {
        let Some(all) = self.rows.valid() else {
            return Ok(None);
        };
        let (keys, values) = self.packed(all)?;
        Ok(Some((
            keys.dequantize().map_err(quant_error)?,
            values.dequantize().map_err(quant_error)?,
        )))
    }
}

impl LayerCache for QuantizedKvCache {
    fn offset(&self) -> usize {
        self.rows.len()
    }

    /// Appends quantized and returns every position dequantized (for
    /// callers outside attention; attention reads the packed form).
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        self.update_and_fetch_packed(keys, values)?;
        self.dequantized()?
            .ok_or(SpecError::Internal("a quantized cache lost its rows"))
    }

    fn can_trim(&self, n: usize) -> bool {
        n <= self.rows.len()
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        self.rows.trim(n)
    }

    fn nbytes(&self) -> usize {
        self.rows.nbytes()
    }

    /// Dequantized: what a drafter borrowing the target's keys reads.
    fn contents(&self) -> Option<(Array, Array)> {
        self.dequantized().ok().flatten()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(self.clone()))
    }

    /// The whole buffer (valid rows first): keys' words, scales, biases,
    /// then the values'.
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        Ok(Some(CacheState {
            kind: self.kind(),
            rows: self.rows.arrays().map(|a| a.to_vec()),
            offset: self.rows.len(),
        }))
    }

    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if state.kind != self.kind() {
            return None;
        }
        let arrays = match state.rows {
            Some(rows) => Some(<[Array; 6]>::try_from(rows).ok()?),
            None => None,
        };
        Some(Box::new(Self {
            quantization: self.quantization,
            rows: Rows::from_parts(arrays, state.offset),
        }))
    }
}

/// `cache` as a quantized KV cache, if it is one.
pub fn quantized_mut(cache: &mut dyn LayerCache) -> Option<&mut QuantizedKvCache> {
    cache.as_any_mut()?.downcast_mut::<QuantizedKvCache>()
}

/// Whether `cache` is a quantized KV cache.
pub fn is_quantized(cache: &dyn LayerCache) -> bool {
    cache.as_any().is_some_and(|c| c.is::<QuantizedKvCache>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::concatenate;

    fn rows(seed: u64, n: i32) -> Array {
        mlx_rs::random::normal::<f32>(
            &[1, 2, n, 64],
            None,
            None,
            &mlx_rs::random::key(seed).expect("key"),
        )
        .expect("normal")
    }

    fn same(a: &Array, b: &Array) -> bool {
        a.shape() == b.shape() && a.eq_values(b).expect("eq")
    }

    #[test]
    fn positions_quantize_alone_so_chunks_trims_and_rewrites_agree() {
        let q = KvQuantization::new(4, 32).expect("params");
        let (a, b, c) = (rows(1, 5), rows(2, 3), rows(3, 300));
        let mut split = QuantizedKvCache::new(q);
        split.update_and_fetch_packed(&a, &a).expect("a");
        split.update_and_fetch_packed(&c, &c).expect("c");
        split.trim(300).expect("trim");
        let (keys, values) = split.update_and_fetch_packed(&b, &b).expect("b");
        assert_eq!(split.offset(), 8);
        let whole = concatenate(&[a.clone(), b.clone()], 2).expect("concat");
        let mut once = QuantizedKvCache::new(q);
        let (want, _) = once.update_and_fetch_packed(&whole, &whole).expect("whole");
        assert!(same(keys.weight(), want.weight()) && same(keys.scales(), want.scales()));
        assert!(same(values.weight(), want.weight()));
        let (k, _) = split.contents().expect("contents");
        assert_eq!(k.shape(), &[1, 2, 8, 64]);
        assert!(split.trim(9).is_err(), "cannot trim past the first row");
        assert_eq!(split.offset(), 8, "a failed trim changes nothing");
    }

    #[test]
    fn bad_parameters_name_their_flag() {
        assert_eq!(
            KvQuantization::new(7, 64),
            Err(KvQuantizationError::Bits(7))
        );
        assert_eq!(
            KvQuantization::new(4, 48),
            Err(KvQuantizationError::GroupSize(48))
        );
        let q = KvQuantization::new(4, 128).expect("params");
        let e = q.check_head_dim(64).expect_err("128 does not divide 64");
        assert!(e.to_string().contains("`--kv-group-size`: 128"), "{e}");
        assert!(q.check_head_dim(256).is_ok());
    }
}
