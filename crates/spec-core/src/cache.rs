//! Per-request caches of a target model, as the serve loop sees them: an
//! offset that grows with every forward and can be rolled back when drafts
//! are rejected.

use mlx_rs::Array;

use crate::SpecError;

/// One cache of a target model (usually one per attention layer).
pub trait LayerCache: std::fmt::Debug {
    /// Tokens seen so far (the position of the next token).
    fn offset(&self) -> usize;
    /// Appends this step's keys and values (`[B, heads, L, D]`) and returns
    /// everything the attention should see.
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError>;
    /// Whether `trim(n)` can drop the last `n` tokens exactly.
    fn can_trim(&self, n: usize) -> bool;
    /// Whether, after appending `append` more tokens, `trim(n)` could still
    /// drop the last `n` exactly (a sliding window may rotate on the way).
    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        n <= self.offset() + append
    }
    /// Drops the last `n` tokens; an error (and no change) if it cannot.
    fn trim(&mut self, n: usize) -> Result<(), SpecError>;
    /// Every token but the last `keep` is final: no later `trim` will go
    /// back past them, so a cache that holds a state per position to roll
    /// back to (a recurrent layer's) may free the older ones. A no-op by
    /// default (keys and values are trimmed by moving the offset).
    fn commit(&mut self, keep: usize) {
        let _ = keep;
    }
    /// The sliding window, for caches that keep only the last tokens.
    fn window(&self) -> Option<usize> {
        None
    }
    /// Bytes held.
    fn nbytes(&self) -> usize;
    /// The cached keys and values (`[B, heads, T, D]`, oldest first: the
    /// positions `offset - T .. offset`, `T < offset` when a sliding window
    /// dropped older ones), for drafters that read the target's keys and
    /// values (KV-borrowing drafters); `None` before the first update. A
    /// cache may store other rows under the same two names (a latent and a
    /// rope key, keys twice); its type says which.
    fn contents(&self) -> Option<(Array, Array)>;
    /// The concrete cache, for the crate that defines it (saving a request's
    /// caches to a file); `None` for caches that do not expose themselves.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
    /// The concrete cache, mutable, for the model that defines it (a layer
    /// whose state is not keys and values, such as a recurrent layer's);
    /// `None` by default.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
    /// An independent copy holding the same tokens (MLX arrays are
    /// immutable, so the copy may share their buffers: writes through one
    /// never reach the other), for a prefix cache that keeps a request's
    /// caches while the request goes on; `None` for caches that cannot be
    /// copied (the default), which are then never kept.
    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        None
    }
    /// What the cache holds, in a form a file can keep
    /// ([`CacheState`]); `None` for caches without one (the default), which
    /// a prompt-cache file then cannot hold.
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        Ok(None)
    }
    /// A cache configured as this one (a fresh cache of the model) holding
    /// `state`; `None` when this cache has no file form or `state` is not
    /// of its kind. The reader checked the rows' shapes and offsets against
    /// the model's.
    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        let _ = state;
        None
    }
}

/// What kind of rows a cache keeps, as a file records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// Keys and values of every position.
    Linear,
    /// Keys and values of the last `window` positions.
    Window(usize),
    /// Keys and values of the first `sinks` positions and of the last
    /// `size - sinks` (mlx-lm's `RotatingKVCache` with `keep = sinks`).
    SinkWindow {
        /// Positions kept in all.
        size: usize,
        /// First positions kept for good.
        sinks: usize,
    },
    /// A compressed latent and a rope key of every position (an MLA layer),
    /// with the layer's key-only caches after it.
    Latent,
    /// Keys alone of every position (an indexer's), belonging to the
    /// `Latent` cache before it.
    KeysOnly,
    /// A recurrent layer's fixed-size states after `offset` tokens (a
    /// Gated DeltaNet layer's conv state and recurrent state): no rows per
    /// position.
    Recurrent,
    /// Keys and values of every position quantized (MLX's affine mode along
    /// the head dimension): the keys' packed words, scales and biases, then
    /// the values'.
    /// Before `start` a file holds the float rows (two arrays), from it on
    /// the packed ones (six).
    Quantized {
        /// Bits per element.
        bits: i32,
        /// Elements per scale and bias.
        group_size: i32,
        /// The first position whose queries read the quantized rows.
        start: usize,
    },
}

/// A cache's contents in a portable form.
#[derive(Debug, Clone)]
pub struct CacheState {
    /// What the rows are.
    pub kind: CacheKind,
    /// `[1, heads, T, width]` arrays: keys and values (`Linear`, `Window`),
    /// latent and rope key (`Latent`), keys alone (`KeysOnly`), six packed
    /// arrays (`Quantized`); a
    /// recurrent layer's states in its own shapes (`Recurrent`); `None`
    /// before the first update. For a `Window`, the valid positions in time
    /// order; for a `SinkWindow`, the sinks then the held positions in time
    /// order; otherwise the whole buffer, valid rows first.
    pub rows: Option<Vec<Array>>,
    /// Tokens seen: the valid rows of a linear buffer, the position after the
    /// last row of a window.
    pub offset: usize,
}

/// All caches of one request, in the order the model uses them.
#[derive(Debug, Default)]
pub struct CacheSet {
    layers: Vec<Box<dyn LayerCache>>,
}

impl CacheSet {
    /// A set over these caches.
    pub fn new(layers: Vec<Box<dyn LayerCache>>) -> Self {
        Self { layers }
    }

    /// The cache at `index`.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut (dyn LayerCache + 'static)> {
        self.layers.get_mut(index).map(|c| c.as_mut())
    }

    /// The cache at `index`, read-only.
    pub fn get(&self, index: usize) -> Option<&(dyn LayerCache + 'static)> {
        self.layers.get(index).map(|c| c.as_ref())
    }

    /// The caches themselves (a host wrapping each in its own cache type).
    pub fn into_layers(self) -> Vec<Box<dyn LayerCache>> {
        self.layers
    }

    /// Number of caches.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the set holds no cache.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Offset of the first cache (all caches of a set advance together).
    pub fn offset(&self) -> usize {
        self.layers.first().map_or(0, |c| c.offset())
    }

    /// Whether a speculative round can append `append` tokens and then
    /// drop up to `n` of them again in every cache.
    pub fn can_trim_after(&self, append: usize, n: usize) -> bool {
        self.layers.iter().all(|c| c.can_trim_after(append, n))
    }

    /// Drops the last `n` tokens from every cache, or changes nothing and
    /// fails if any cache cannot.
    pub fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if let Some((i, stuck)) = self.layers.iter().enumerate().find(|(_, c)| !c.can_trim(n)) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "cache {i} (offset {}, window {:?}) cannot roll back that far",
                    stuck.offset(),
                    stuck.window()
                ),
            });
        }
        self.layers.iter_mut().try_for_each(|c| c.trim(n))
    }

    /// The tokens before `offset` are final in every cache
    /// ([`LayerCache::commit`]): the host will not roll back past them.
    pub fn commit_to(&mut self, offset: usize) {
        for c in &mut self.layers {
            let keep = c.offset().saturating_sub(offset);
            c.commit(keep);
        }
    }

    /// An independent copy of every cache ([`LayerCache::duplicate`]), or
    /// `None` when any cache cannot be copied.
    pub fn duplicate(&self) -> Option<CacheSet> {
        let layers = self
            .layers
            .iter()
            .map(|c| c.duplicate())
            .collect::<Option<Vec<_>>>()?;
        Some(CacheSet { layers })
    }

    /// Bytes held by all caches.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(|c| c.nbytes()).sum()
    }
}
