//! `QuantizedKvCache`: keys and values stored quantized (MLX's affine mode,
//! groups along the head dimension), as mlx-lm's `QuantizedKVCache` keeps
//! them (`--kv-bits`, `--kv-group-size`), from position `start` on
//! (`--quantized-kv-start`).
//!
//! A query at a position before `start` attends float keys and values, a
//! query at `start` or after attends every position quantized: what mlx-lm
//! computes when its cache converts once it holds `start` positions, decided
//! here by each query's position rather than by when a forward ended, so a
//! window's rows do not depend on how the tokens arrived (prompt chunks,
//! verify windows, rolled-back drafts, prefix-cache hits). Each position's
//! row is quantized on its own. The float rows of the positions before
//! `start` are dropped once the cache is [`FLOAT_SLACK`] positions past it
//! (no rollback reaches back that far; a trim below `start` is refused from
//! then on).

use mlx_ext::quant::{Packed, QuantParams, AFFINE_BITS, AFFINE_GROUP_SIZES};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

use super::buffer::{rows_of, slice, Rows};
use crate::sdpa::{self, Mask};

/// Positions past `start` after which the float rows before it are dropped.
pub const FLOAT_SLACK: usize = 256;

/// The bits, group size and first quantized query position of a quantized
/// KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuantization {
    /// Bits per element.
    pub bits: i32,
    /// Elements of the head dimension sharing a scale and a bias.
    pub group_size: i32,
    /// Queries from this position on read the quantized keys and values;
    /// earlier ones the float ones (mlx-lm's `quantized_kv_start`).
    pub start: usize,
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
    /// mlx-lm's default first quantized position (`--quantized-kv-start`).
    pub const DEFAULT_START: usize = 5000;

    /// `bits` with `group_size` from position `start`, if MLX's affine mode
    /// takes them.
    pub fn new(bits: i32, group_size: i32, start: usize) -> Result<Self, KvQuantizationError> {
        if !AFFINE_BITS.contains(&bits) {
            return Err(KvQuantizationError::Bits(bits));
        }
        if !AFFINE_GROUP_SIZES.contains(&group_size) {
            return Err(KvQuantizationError::GroupSize(group_size));
        }
        Ok(Self {
            bits,
            group_size,
            start,
        })
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

/// Which keys a window of queries reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Every query before `start`: the float keys and values.
    Float,
    /// Every query at `start` or after: the quantized ones.
    Quantized,
    /// Queries on both sides.
    Straddles,
}

/// What a window wholly on one side reads, after its rows were appended.
#[derive(Debug)]
pub enum Fetched {
    /// Float keys and values of the positions before `start` seen so far.
    Float(Array, Array),
    /// Every position's six arrays (keys' packed words, scales and biases,
    /// then the values'; [`pack`] makes them keys and values) and their
    /// quantization.
    Packed([Array; 6], QuantParams),
}

/// Keys and values from a quantized cache's six arrays (keys' packed words,
/// scales and biases, then the values'), checked against `params`.
pub fn pack(rows: [Array; 6], params: QuantParams) -> Result<(Packed, Packed), SpecError> {
    let [kw, ks, kb, vw, vs, vb] = rows;
    let keys = Packed::from_parts(kw, ks, Some(kb), params).map_err(quant_error)?;
    let values = Packed::from_parts(vw, vs, Some(vb), params).map_err(quant_error)?;
    Ok((keys, values))
}

/// Keys and values of every position, quantized: six arrays
/// `[B, heads, T, ..]` in lockstep (keys' packed words, scales and biases,
/// then the values'), grown in mlx-lm's steps and trimmed exactly; and,
/// while kept, the float keys and values of the positions before `start`.
#[derive(Debug, Clone)]
pub struct QuantizedKvCache {
    quantization: KvQuantization,
    rows: Rows<6>,
    /// Positions `..min(offset, start)` in float; `None` once dropped (or
    /// never needed, with `start` 0).
    float: Option<Rows<2>>,
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
            float: (quantization.start > 0).then(Rows::default),
        }
    }

    /// Its bits, group size and start.
    pub fn quantization(&self) -> KvQuantization {
        self.quantization
    }

    /// What a file records it as.
    fn kind(&self) -> CacheKind {
        CacheKind::Quantized {
            bits: self.quantization.bits,
            group_size: self.quantization.group_size,
            start: self.quantization.start,
        }
    }

    /// Which keys the next window of `len` queries reads.
    pub fn side(&self, len: usize) -> Side {
        let (at, start) = (self.rows.len(), self.quantization.start);
        if at >= start {
            Side::Quantized
        } else if at + len <= start {
            Side::Float
        } else {
            Side::Straddles
        }
    }

    /// Quantizes this step's keys and values (`[B, heads, L, D]`) and
    /// appends them, keeping the float rows of those before `start`.
    fn append(&mut self, keys: &Array, values: &Array) -> Result<(), SpecError> {
        let at = self.rows.len();
        let l = rows_of(keys);
        let start = self.quantization.start;
        let before = start.saturating_sub(at).min(l);
        if before > 0 {
            let Some(float) = self.float.as_mut() else {
                return Err(SpecError::Internal(
                    "a quantized cache lost the float rows before its start",
                ));
            };
            if before == l {
                float.append([keys, values])?;
            } else {
                float.append([&slice(keys, 0, before), &slice(values, 0, before)])?;
            }
        }
        let params = self.quantization.params();
        let k = Packed::quantize(keys, params).map_err(quant_error)?;
        let v = Packed::quantize(values, params).map_err(quant_error)?;
        let (kw, ks, kb) = k.into_parts();
        let (vw, vs, vb) = v.into_parts();
        let (Some(kb), Some(vb)) = (kb, vb) else {
            return Err(SpecError::Internal("affine quantization without biases"));
        };
        self.rows.append([&kw, &ks, &kb, &vw, &vs, &vb])?;
        if self.rows.len() >= start + FLOAT_SLACK {
            self.float = None;
        }
        Ok(())
    }

    /// Every position's six arrays.
    fn valid_rows(&self) -> Result<[Array; 6], SpecError> {
        self.rows
            .valid()
            .ok_or(SpecError::Internal("a quantized cache lost its rows"))
    }

    /// Every position's keys and values, packed.
    fn packed(&self) -> Result<(Packed, Packed), SpecError> {
        pack(self.valid_rows()?, self.quantization.params())
    }

    /// The float keys and values before `start` seen so far.
    fn float_rows(&self) -> Result<(Array, Array), SpecError> {
        let [k, v] = self
            .float
            .as_ref()
            .and_then(Rows::valid)
            .ok_or(SpecError::Internal("a quantized cache lost its float rows"))?;
        Ok((k, v))
    }

    /// Appends a window wholly on one side of `start` (`side` said so) and
    /// returns what its queries read.
    pub fn update_and_fetch_side(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<Fetched, SpecError> {
        let side = self.side(rows_of(keys));
        self.append(keys, values)?;
        match side {
            Side::Float => {
                let (k, v) = self.float_rows()?;
                Ok(Fetched::Float(k, v))
            }
            Side::Quantized => Ok(Fetched::Packed(
                self.valid_rows()?,
                self.quantization.params(),
            )),
            Side::Straddles => Err(SpecError::Internal(
                "a window across the quantized start fetched as one side",
            )),
        }
    }

    /// Appends this step's keys and values (`[B, kv, L, D]`, after RoPE)
    /// and attends `queries` (`[B, heads, L, D]`, the window's last `L`
    /// positions), causally within the window: those before `start` over
    /// the float keys, the others over every position quantized
    /// (`sdpa::quantized_attention`). `[B, heads, L, D]`.
    pub fn attend(
        &mut self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
    ) -> Result<Array, crate::ModelError> {
        let l = queries.dim(2);
        let at = self.rows.len();
        let before = self.quantization.start.saturating_sub(at).min(l as usize) as i32;
        self.append(keys, values)?;
        let causal = |n: i32| if n > 1 { Mask::Causal } else { Mask::None };
        let mut parts = Vec::with_capacity(2);
        if before > 0 {
            let (k, v) = self.float_rows()?;
            let q = queries.index((.., .., 0..before, ..));
            parts.push(sdpa::attention(&q, &k, &v, scale, causal(before))?);
        }
        if before < l {
            let (k, v) = self.packed()?;
            let q = if before > 0 {
                queries.index((.., .., before..l, ..))
            } else {
                queries.clone()
            };
            parts.push(sdpa::quantized_attention(
                &q,
                &k,
                &v,
                scale,
                causal(l - before),
            )?);
        }
        Ok(match parts.len() {
            1 => parts.remove(0),
            _ => concatenate(&parts, 2)?,
        })
    }

    /// The valid positions, dequantized.
    fn dequantized(&self) -> Result<Option<(Array, Array)>, SpecError> {
        if self.rows.arrays().is_none() {
            return Ok(None);
        }
        let (keys, values) = self.packed()?;
        Ok(Some((
            keys.dequantize().map_err(quant_error)?,
            values.dequantize().map_err(quant_error)?,
        )))
    }

    /// A cache holding the float rows `[keys, values]` (`[1, heads, T, D]`,
    /// the first `offset` valid): each quantized, the float ones kept for
    /// the positions before `start`.
    fn with_float_rows(
        quantization: KvQuantization,
        rows: [Array; 2],
        offset: usize,
    ) -> Option<Self> {
        let mut cache = Self::new(quantization);
        if offset > 0 {
            let [k, v] = rows.map(|a| slice(&a, 0, offset));
            cache.append(&k, &v).ok()?;
        }
        Some(cache)
    }
}

impl LayerCache for QuantizedKvCache {
    fn offset(&self) -> usize {
        self.rows.len()
    }

    /// Appends and returns every position dequantized (for callers outside
    /// attention; attention reads through [`QuantizedKvCache::attend`]).
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        self.append(keys, values)?;
        self.dequantized()?
            .ok_or(SpecError::Internal("a quantized cache lost its rows"))
    }

    /// Within the rows held; below `start` only while the float rows are.
    fn can_trim(&self, n: usize) -> bool {
        let at = self.rows.len();
        n <= at && (self.float.is_some() || at - n >= self.quantization.start)
    }

    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        let at = self.rows.len() + append;
        let kept = self.float.is_some() && at < self.quantization.start + FLOAT_SLACK;
        n <= at && (kept || at - n >= self.quantization.start)
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "{} positions held, the float rows before --quantized-kv-start {} dropped",
                    self.rows.len(),
                    self.quantization.start
                ),
            });
        }
        let at = self.rows.len();
        let start = self.quantization.start;
        if let Some(float) = self.float.as_mut() {
            float.trim(at.min(start) - (at - n).min(start))?;
        }
        self.rows.trim(n)
    }

    fn nbytes(&self) -> usize {
        self.rows.nbytes() + self.float.as_ref().map_or(0, Rows::nbytes)
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

    /// Before `start`: the float rows (mlx-lm's cache before it converts,
    /// a `KVCache`); from `start` on: the six packed arrays, the whole
    /// buffer (its `QuantizedKVCache`).
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        let offset = self.rows.len();
        let rows = if offset < self.quantization.start {
            match self.float.as_ref() {
                Some(float) => float.arrays().map(|a| a.to_vec()),
                None => {
                    return Err(SpecError::Internal(
                        "a quantized cache lost the float rows before its start",
                    ))
                }
            }
        } else {
            self.rows.arrays().map(|a| a.to_vec())
        };
        Ok(Some(CacheState {
            kind: self.kind(),
            rows,
            offset,
        }))
    }

    /// Two float arrays (each position quantized, the float rows before
    /// `start` kept) or six packed ones at `start` or past it (no float
    /// rows: the cache cannot roll back below `start`).
    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if state.kind != self.kind() {
            return None;
        }
        let cache = match state.rows {
            None => Self::new(self.quantization),
            Some(rows) if rows.len() == 2 => Self::with_float_rows(
                self.quantization,
                <[Array; 2]>::try_from(rows).ok()?,
                state.offset,
            )?,
            Some(rows) if state.offset >= self.quantization.start => Self {
                quantization: self.quantization,
                rows: Rows::from_parts(Some(<[Array; 6]>::try_from(rows).ok()?), state.offset),
                float: None,
            },
            Some(_) => return None,
        };
        Some(Box::new(cache))
    }
}

/// `cache` as a quantized KV cache, if it is one.
pub fn quantized_mut(cache: &mut dyn LayerCache) -> Option<&mut QuantizedKvCache> {
    cache.as_any_mut()?.downcast_mut::<QuantizedKvCache>()
}

/// `cache` as a quantized KV cache, if it is one.
pub fn quantized_ref(cache: &dyn LayerCache) -> Option<&QuantizedKvCache> {
    cache.as_any()?.downcast_ref::<QuantizedKvCache>()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn packed_of(c: &QuantizedKvCache) -> (Packed, Packed) {
        c.packed().expect("packed")
    }

    #[test]
    fn positions_quantize_alone_so_chunks_trims_and_rewrites_agree() {
        let q = KvQuantization::new(4, 32, 0).expect("params");
        let (a, b, c) = (rows(1, 5), rows(2, 3), rows(3, 300));
        let mut split = QuantizedKvCache::new(q);
        split.append(&a, &a).expect("a");
        split.append(&c, &c).expect("c");
        split.trim(300).expect("trim");
        split.append(&b, &b).expect("b");
        assert_eq!(split.offset(), 8);
        let whole = concatenate(&[a.clone(), b.clone()], 2).expect("concat");
        let mut once = QuantizedKvCache::new(q);
        once.append(&whole, &whole).expect("whole");
        let ((keys, values), (want, _)) = (packed_of(&split), packed_of(&once));
        assert!(same(keys.weight(), want.weight()) && same(keys.scales(), want.scales()));
        assert!(same(values.weight(), want.weight()));
        let (k, _) = split.contents().expect("contents");
        assert_eq!(k.shape(), &[1, 2, 8, 64]);
        assert!(split.trim(9).is_err(), "cannot trim past the first row");
        assert_eq!(split.offset(), 8, "a failed trim changes nothing");
    }

    /// With a start, the float rows before it follow the offset (appends
    /// across it, trims back below it) until the cache is `FLOAT_SLACK`
    /// past it; from then on a trim below the start is refused.
    #[test]
    fn float_rows_before_the_start_follow_trims_until_dropped() {
        let q = KvQuantization::new(8, 64, 6).expect("params");
        let mut c = QuantizedKvCache::new(q);
        assert_eq!(c.side(6), Side::Float);
        assert_eq!(c.side(7), Side::Straddles);
        c.append(&rows(1, 4), &rows(1, 4)).expect("4");
        c.append(&rows(2, 5), &rows(2, 5))
            .expect("5 across the start");
        assert_eq!(c.side(1), Side::Quantized);
        assert_eq!(rows_of(&c.float_rows().expect("float").0), 6);
        c.trim(7).expect("below the start");
        assert_eq!(rows_of(&c.float_rows().expect("float").0), 2);
        assert_eq!(c.offset(), 2);
        let state = c.state().expect("state").expect("some");
        assert_eq!(
            state.rows.as_ref().map(Vec::len),
            Some(2),
            "float before the start"
        );
        let back = c.restored(state).expect("restored");
        assert_eq!(back.offset(), 2);
        c.append(
            &rows(3, FLOAT_SLACK as i32 + 4),
            &rows(3, FLOAT_SLACK as i32 + 4),
        )
        .expect("past the slack");
        assert!(c.float.is_none(), "float rows dropped");
        let at = c.offset();
        assert!(c.can_trim(at - 6) && !c.can_trim(at - 5));
        let err = c.trim(at - 5).expect_err("below the start");
        assert!(err.to_string().contains("--quantized-kv-start 6"), "{err}");
        let state = c.state().expect("state").expect("some");
        assert_eq!(
            state.rows.as_ref().map(Vec::len),
            Some(6),
            "packed past the start"
        );
    }

    #[test]
    fn bad_parameters_name_their_flag() {
        assert_eq!(
            KvQuantization::new(7, 64, 0),
            Err(KvQuantizationError::Bits(7))
        );
        assert_eq!(
            KvQuantization::new(4, 48, 0),
            Err(KvQuantizationError::GroupSize(48))
        );
        let q = KvQuantization::new(4, 128, 0).expect("params");
        let e = q.check_head_dim(64).expect_err("128 does not divide 64");
        assert!(e.to_string().contains("`--kv-group-size`: 128"), "{e}");
        assert!(q.check_head_dim(256).is_ok());
    }
}
