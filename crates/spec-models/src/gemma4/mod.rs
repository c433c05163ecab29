//! Gemma 4 as mlx-lm 0.32.2 defines it (`models/gemma4_text.py`, and the
//! text part of `models/gemma4.py`): sliding and full attention layers
//! (`layer_types`), rotating caches on sliding layers, RoPE per layer kind
//! (default on sliding layers, proportional partial RoPE on full ones), q/k
//! norms and a scale-free v norm, attention scale 1, GeGLU MLP (double-wide on
//! KV-shared layers when configured), `layer_scalar`, embeddings scaled by
//! `sqrt(hidden)`, tied or untied head, final logit softcapping, KV-shared
//! layers, per-layer inputs (E2B/E4B), `attention_k_eq_v` and the
//! mixture-of-experts block (26B-A4B: `enable_moe_block`).
//!
//! Files: `config` (config.json with mlx-lm's defaults), `cache` (the
//! sliding cache with exact rollback past the window), `model` (the decoder
//! and its `Target`), `moe` (router and experts), and here the donor views the Gemma-4 assistant drafter
//! reads.

mod config;
mod model;
mod moe;

use mlx_rs::Array;
use spec_core::{CacheSet, SpecError};

pub use crate::cache::SlidingKvCache;
pub use config::{Config, LayerKind, LayerSpec, MoeConfig, RopeSpec};
pub use model::Model;

/// Keys and values of one cache in time order, read-only.
#[derive(Debug, Clone)]
pub struct KvView {
    /// `[B, kv_heads, T, head_dim]`, oldest first.
    pub keys: Array,
    /// `[B, kv_heads, T, head_dim]`, oldest first.
    pub values: Array,
    /// Tokens the cache has seen: the rows are positions `offset - T .. offset`.
    pub offset: usize,
}

/// The donor caches of a Gemma-4 target: its last sliding and last full
/// layer that own a cache (KV-shared layers have none).
#[derive(Debug, Clone)]
pub struct Donors {
    /// The last sliding layer's keys (the ring unrolled), when there is one.
    pub sliding: Option<KvView>,
    /// The last full layer's keys, when there is one.
    pub full: Option<KvView>,
}

/// Time-ordered views of `model`'s donor caches in `caches` (a set from
/// `model.make_caches()`). The arrays are MLX values: later updates of the
/// caches do not change them, so they stay valid for a whole draft round.
pub fn donor_views(model: &Model, caches: &CacheSet) -> Result<Donors, SpecError> {
    let (sliding, full) = model.donor_layers();
    let view = |index: Option<usize>| -> Result<Option<KvView>, SpecError> {
        let Some(i) = index else { return Ok(None) };
        let cache = caches.get(i).ok_or(spec_core::InputError::CacheSlot {
            slot: i,
            len: caches.len(),
        })?;
        Ok(cache.contents().map(|(keys, values)| KvView {
            keys,
            values,
            offset: cache.offset(),
        }))
    };
    Ok(Donors {
        sliding: view(sliding)?,
        full: view(full)?,
    })
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod streamed_tests;
