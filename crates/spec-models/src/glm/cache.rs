//! The GLM caches: the compressed MLA cache (per position, the normalised
//! key/value latent `[B, 1, T, kv_lora_rank]` and the rotated rope key
//! `[B, 1, T, qk_rope_head_dim]` instead of per-head keys and values) and the
//! DSA indexer's key cache, both linear caches (`crate::cache`).

use mlx_rs::Array;
use spec_core::{LayerCache, SpecError};

use crate::cache::{KvCache, LinearCache};

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

    /// The cached `(latent, rope)` rows, `None` while empty.
    fn contents(&self) -> Option<(Array, Array)> {
        if self.rows.offset() == 0 {
            return None;
        }
        self.rows.contents()
    }
}

/// The DSA indexer's key cache (`[B, 1, T, index_head_dim]`). It keeps keys
/// only (`update_and_fetch` ignores its `values` and returns the keys twice):
/// a values buffer that nothing reads would never be evaluated, and its lazy
/// updates would pile up round after round (mlx-lm resets its values to
/// zeros for the same reason).
pub type IndexerCache = LinearCache<1>;
