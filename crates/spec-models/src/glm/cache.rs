//! The GLM caches: the compressed MLA cache (per position, the normalised
//! key/value latent `[B, 1, T, kv_lora_rank]` and the rotated rope key
//! `[B, 1, T, qk_rope_head_dim]` instead of per-head keys and values) and the
//! DSA indexer's key cache, both linear caches (`crate::cache`).

use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

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
            return Err(spec_core::InputError::shapes(
                "an MLA cache's latents and rotary keys",
                format!("[.., {}] and [.., {}]", self.kv_lora_rank, self.rope_dim),
                keys.shape(),
                values.shape(),
            )
            .into());
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

    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(self.clone()))
    }

    /// `Latent`: the latent and rope rows (keys: the latent, values: the
    /// rope key).
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        let (arrays, len) = self.rows.raw();
        Ok(Some(CacheState {
            kind: CacheKind::Latent,
            rows: arrays.map(|a| a.to_vec()),
            offset: len,
        }))
    }

    /// This cache's geometry over the rows (the reader checked the widths).
    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if state.kind != CacheKind::Latent {
            return None;
        }
        let arrays = match state.rows {
            Some(rows) => Some(<[Array; 2]>::try_from(rows).ok()?),
            None => None,
        };
        Some(Box::new(Self {
            role: self.role,
            kv_lora_rank: self.kv_lora_rank,
            rope_dim: self.rope_dim,
            rows: KvCache::from_raw(arrays, state.offset),
        }))
    }
}

/// The DSA indexer's key cache (`[B, 1, T, index_head_dim]`). It keeps keys
/// only (`update_and_fetch` ignores its `values` and returns the keys twice):
/// a values buffer that nothing reads would never be evaluated, and its lazy
/// updates would pile up round after round (mlx-lm resets its values to
/// zeros for the same reason).
pub type IndexerCache = LinearCache<1>;

/// The MTP row's caches: its latent cache and, when the row carries its own
/// DSA indexer (GLM-5.2 ships `model.layers.{N}.self_attn.indexer.*`), that
/// indexer's key cache. Both always hold the same positions: they grow,
/// trim, snapshot and restore together. A clone is a snapshot.
#[derive(Debug, Clone)]
pub struct MtpCache {
    latent: MlaCache,
    indexer: Option<IndexerCache>,
}

impl MtpCache {
    /// An empty MTP cache of this geometry, with an indexer cache or not.
    pub fn new(kv_lora_rank: i32, rope_dim: i32, with_indexer: bool) -> Self {
        Self {
            latent: MlaCache::new(MlaRole::Mtp, kv_lora_rank, rope_dim),
            indexer: with_indexer.then(IndexerCache::new),
        }
    }

    /// Rows held.
    pub fn offset(&self) -> usize {
        self.latent.offset()
    }

    /// `(kv_lora_rank, qk_rope_head_dim)`.
    pub fn geometry(&self) -> (i32, i32) {
        self.latent.geometry()
    }

    /// Whether it holds an indexer key cache.
    pub fn has_indexer(&self) -> bool {
        self.indexer.is_some()
    }

    /// Drops the last `n` rows of both caches, or nothing when either
    /// cannot (they hold the same rows, so both can or neither).
    pub fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        let indexer_ok = self.indexer.as_ref().is_none_or(|c| c.can_trim(n));
        if !self.latent.can_trim(n) || !indexer_ok {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!("the MTP cache holds {} rows", self.offset()),
            });
        }
        self.latent.trim(n)?;
        if let Some(c) = &mut self.indexer {
            c.trim(n)?;
        }
        Ok(())
    }

    /// Bytes held by both caches.
    pub fn nbytes(&self) -> usize {
        self.latent.nbytes() + self.indexer.as_ref().map_or(0, LayerCache::nbytes)
    }

    /// The cached `(latent, rope)` rows, `None` while empty.
    pub fn contents(&self) -> Option<(Array, Array)> {
        self.latent.contents()
    }

    /// The indexer's cached keys `[1, 1, T, index_head_dim]` (`None` while
    /// empty or without an indexer).
    pub fn indexer_keys(&self) -> Option<Array> {
        self.indexer
            .as_ref()
            .filter(|c| c.offset() > 0)
            .and_then(LayerCache::contents)
            .map(|(k, _)| k)
    }

    /// The latent cache and the indexer cache, for one forward.
    pub(super) fn parts(&mut self) -> (&mut MlaCache, Option<&mut IndexerCache>) {
        (&mut self.latent, self.indexer.as_mut())
    }

    /// Whether both parts hold the same number of rows.
    pub(super) fn aligned(&self) -> bool {
        self.indexer
            .as_ref()
            .is_none_or(|c| c.offset() == self.latent.offset())
    }
}
