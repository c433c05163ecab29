//! The compressed MLA cache: per position, the normalised key/value latent
//! (`[B, 1, T, kv_lora_rank]`) and the rotated rope key (`[B, 1, T,
//! qk_rope_head_dim]`) instead of per-head keys and values.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::Array;
use spec_core::{LayerCache, SpecError};

use crate::cache::KvCache;

/// Whose positions a cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlaRole {
    /// A decoder layer of the target.
    Target,
    /// The native MTP row.
    Mtp,
}

/// A trimmable latent + rope cache.
#[derive(Debug, Clone)]
pub struct MlaCache {
    role: MlaRole,
    kv_lora_rank: i32,
    rope_dim: i32,
    rows: KvCache,
}

impl MlaCache {
    /// An empty cache of this geometry.
    pub fn new(role: MlaRole, kv_lora_rank: i32, rope_dim: i32) -> Self {
        Self {
            role,
            kv_lora_rank,
            rope_dim,
            rows: KvCache::new(),
        }
    }

    /// Whose positions it holds.
    pub fn role(&self) -> MlaRole {
        self.role
    }

    /// `(kv_lora_rank, qk_rope_head_dim)`.
    pub fn geometry(&self) -> (i32, i32) {
        (self.kv_lora_rank, self.rope_dim)
    }

    /// The cached `(latent, rope)` rows, `None` while empty.
    pub fn contents(&self) -> Option<(Array, Array)> {
        if self.rows.offset() == 0 {
            return None;
        }
        self.rows.contents()
    }
}

impl LayerCache for MlaCache {
    fn offset(&self) -> usize {
        self.rows.offset()
    }

    /// `keys` is the latent `[B, 1, L, kv_lora_rank]`, `values` the rope key
    /// `[B, 1, L, qk_rope_head_dim]`.
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        let width = |a: &Array| a.shape().last().copied();
        if width(keys) != Some(self.kv_lora_rank) || width(values) != Some(self.rope_dim) {
            return Err(SpecError::Invalid(format!(
                "MLA cache of widths ({}, {}) given {:?} and {:?}",
                self.kv_lora_rank,
                self.rope_dim,
                keys.shape(),
                values.shape()
            )));
        }
        self.rows.update_and_fetch(keys, values)
    }

    fn can_trim(&self, n: usize) -> bool {
        self.rows.can_trim(n)
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        self.rows.trim(n)
    }

    fn nbytes(&self) -> usize {
        self.rows.nbytes()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The DSA indexer's key cache (`[B, 1, T, index_head_dim]`). It keeps keys
/// only: a values buffer that nothing reads would never be evaluated, and
/// its lazy updates would pile up round after round (mlx-lm resets its
/// values to zeros for the same reason).
#[derive(Debug, Clone, Default)]
pub struct IndexerCache {
    keys: Option<Array>,
    offset: usize,
}

/// Positions added at a time when the buffer is full (as `KvCache`).
const STEP: i32 = 256;

impl IndexerCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LayerCache for IndexerCache {
    fn offset(&self) -> usize {
        self.offset
    }

    /// Appends `keys`; `values` is ignored. Returns the cached keys twice.
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        _values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        let shape = keys.shape();
        if shape.len() != 4 {
            return Err(SpecError::Invalid(format!(
                "indexer cache expects [B, 1, L, D], got {shape:?}"
            )));
        }
        let (prev, l) = (self.offset as i32, shape[2]);
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if prev + l > capacity {
            let steps = (STEP + l - 1) / STEP;
            let fresh = mlx_rs::ops::zeros_dtype(
                &[shape[0], shape[1], steps * STEP, shape[3]],
                keys.dtype(),
            )?;
            self.keys = Some(match self.keys.take() {
                None => fresh,
                Some(old) => {
                    mlx_rs::ops::concatenate(&[old.index((.., .., ..prev, ..)), fresh], 2)?
                }
            });
        }
        let buffer = self
            .keys
            .as_mut()
            .ok_or_else(|| SpecError::Invalid("indexer cache buffer missing".into()))?;
        let end = prev + l;
        buffer.try_index_mut((.., .., prev..end, ..), keys)?;
        self.offset = end as usize;
        let fetched = buffer.index((.., .., ..end, ..));
        Ok((fetched.clone(), fetched))
    }

    fn can_trim(&self, n: usize) -> bool {
        n <= self.offset
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if n > self.offset {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!("only {} tokens cached", self.offset),
            });
        }
        self.offset -= n;
        Ok(())
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
