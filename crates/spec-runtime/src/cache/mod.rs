//! The caches of the target models, all stored in one buffer type
//! (`buffer::Rows`): `LinearCache` grows in steps of 256 positions (as mlx-lm's
//! `KVCache` does) and trims exactly; `SlidingKvCache` keeps mlx-lm's sliding layout
//! and rolls back exactly past the window (the sliding layers of Gemma-4 and
//! the llama family, gpt-oss's among them). GLM's `glm::MlaCache` builds on
//! the same buffer. `QuantizedKvCache` keeps keys and values quantized
//! (`--kv-bits`); `SinkWindowKvCache` bounds them to a window that keeps
//! the first positions (`--max-kv-size`).

mod buffer;
mod quantized;
mod saved_head;
mod sink_window;
mod sliding;

use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

pub use buffer::{concat_rows, rows_of, slice, try_map, Rows};
pub use quantized::{
    pack, quantized_mut, quantized_ref, Fetched, KvQuantization, KvQuantizationError,
    QuantizedKvCache, Side, FLOAT_SLACK,
};
pub use saved_head::SavedHeadRows;
pub use sink_window::{SinkWindowKvCache, MAX_KV_OPTION, MAX_KV_SINKS};
pub use sliding::SlidingKvCache;

/// Checks a cache update's keys and values: `[B, heads, L, D]` each, one
/// `B`, `heads` and `L` (at least one position).
pub fn check_update(keys: &Array, values: &Array) -> Result<(), SpecError> {
    if keys.ndim() != 4 || values.ndim() != 4 || keys.shape()[..3] != values.shape()[..3] {
        return Err(spec_core::InputError::shapes(
            "a KV cache's keys and values",
            "[B, heads, L, D] with one B, heads and L",
            keys.shape(),
            values.shape(),
        )
        .into());
    }
    if rows_of(keys) == 0 {
        return Err(spec_core::InputError::NoTokens {
            what: "a KV cache update",
        }
        .into());
    }
    Ok(())
}

/// A growable, exactly trimmable cache of `N` tensors per position: keys and
/// values (`N = 2`, [`KvCache`]) or keys alone (`N = 1`, the GLM indexer's).
/// A clone is a snapshot: later updates of either copy never show in the
/// other (MLX arrays are immutable; an update replaces the buffer).
#[derive(Debug, Default, Clone)]
pub struct LinearCache<const N: usize> {
    rows: Rows<N>,
}

/// Per-head keys and values `[B, kv_heads, T, head_dim]`.
pub type KvCache = LinearCache<2>;

impl<const N: usize> LinearCache<N> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The whole buffer (valid rows first, then room) and the valid count.
    pub fn raw(&self) -> (Option<&[Array; N]>, usize) {
        (self.rows.arrays(), self.rows.len())
    }

    /// A cache over `arrays` (`[B, heads, capacity, D]`) whose first `len`
    /// rows are valid; the caller checked `len <= capacity`.
    pub fn from_raw(arrays: Option<[Array; N]>, len: usize) -> Self {
        Self {
            rows: Rows::from_parts(arrays, len),
        }
    }

    /// What a file records this cache as.
    const KIND: Option<CacheKind> = match N {
        2 => Some(CacheKind::Linear),
        1 => Some(CacheKind::KeysOnly),
        _ => None,
    };
}

/// The first and the last of `N` arrays: keys and values, or keys twice.
fn pair<const N: usize>(arrays: [Array; N]) -> (Array, Array) {
    (arrays[0].clone(), arrays[N - 1].clone())
}

impl<const N: usize> LayerCache for LinearCache<N> {
    fn offset(&self) -> usize {
        self.rows.len()
    }

    /// With `N = 1` only `keys` is kept, and returned twice.
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        let given = [keys, values];
        self.rows
            .append(std::array::from_fn(|i| given[i.min(1)]))
            .map(pair)
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

    fn contents(&self) -> Option<(Array, Array)> {
        self.rows.valid().map(pair)
    }

    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(self.clone()))
    }

    /// `Linear` with keys and values, `KeysOnly` with keys alone.
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        let Some(kind) = Self::KIND else {
            return Ok(None);
        };
        let rows = self.rows.arrays().map(|a| a.to_vec());
        Ok(Some(CacheState {
            kind,
            rows,
            offset: self.rows.len(),
        }))
    }

    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if Some(state.kind) != Self::KIND {
            return None;
        }
        let arrays = match state.rows {
            Some(rows) => Some(<[Array; N]>::try_from(rows).ok()?),
            None => None,
        };
        Some(Box::new(Self::from_raw(arrays, state.offset)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    fn step(n: i32, fill: f32) -> Array {
        Array::from_slice(&vec![fill; (2 * n * 4) as usize], &[1, 2, n, 4])
    }

    #[test]
    fn kv_cache_grows_trims_and_overwrites() {
        let mut c = KvCache::new();
        let (k, _) = c
            .update_and_fetch(&step(3, 1.0), &step(3, 1.0))
            .expect("update");
        assert_eq!(k.shape(), &[1, 2, 3, 4]);
        c.update_and_fetch(&step(300, 2.0), &step(300, 2.0))
            .expect("grow past one step");
        assert_eq!(c.offset(), 303);
        c.trim(2).expect("trim");
        let (k, _) = c
            .update_and_fetch(&step(1, 9.0), &step(1, 9.0))
            .expect("after trim");
        assert_eq!(k.shape(), &[1, 2, 302, 4]);
        let last: Vec<f32> = k
            .index((.., .., 301.., ..))
            .flatten(None, None)
            .expect("flatten")
            .as_slice::<f32>()
            .to_vec();
        assert!(
            last.iter().all(|&v| v == 9.0),
            "trimmed rows are overwritten"
        );
        assert!(c.trim(400).is_err(), "cannot trim more than cached");
        assert_eq!(c.offset(), 302, "a failed trim changes nothing");
    }
}
