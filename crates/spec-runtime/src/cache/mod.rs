//! The caches of the target models, all stored in one buffer type
//! (`buffer::Rows`): `LinearCache` grows in steps of 256 positions (as mlx-lm's
//! `KVCache` does) and trims exactly; `RotatingKvCache` keeps a sliding window
//! and can be trimmed only until it first drops a token. The GLM and Gemma-4
//! caches (`glm::MlaCache`, `gemma4::SlidingKvCache`) build on the same
//! buffer. `QuantizedKvCache` keeps keys and values quantized
//! (`--kv-bits`); `SinkWindowKvCache` bounds them to a window that keeps
//! the first positions (`--max-kv-size`).

mod buffer;
mod quantized;
mod saved_head;
mod sink_window;

use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

pub use buffer::{concat_rows, rows_of, slice, try_map, Rows};
pub use quantized::{
    pack, quantized_mut, quantized_ref, Fetched, KvQuantization, KvQuantizationError,
    QuantizedKvCache, Side, FLOAT_SLACK,
};
pub use saved_head::SavedHeadRows;
pub use sink_window::{SinkWindowKvCache, MAX_KV_OPTION, MAX_KV_SINKS};

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

/// A sliding-window cache: keeps the last `window` positions in temporal
/// order. Trimming is exact until the first position falls out of the
/// window; after that `can_trim` is false (the dropped rows are gone).
#[derive(Debug, Clone)]
pub struct RotatingKvCache {
    window: usize,
    /// Every row valid: the concatenated positions, cut to the window.
    rows: Rows<2>,
    offset: usize,
}

impl RotatingKvCache {
    /// An empty cache keeping `window` positions.
    pub fn new(window: usize) -> Self {
        Self {
            window,
            rows: Rows::default(),
            offset: 0,
        }
    }

    /// The kept positions (`[B, heads, T, D]`, time order, all valid) and
    /// the offset.
    pub fn raw(&self) -> (Option<&[Array; 2]>, usize) {
        (self.rows.arrays(), self.offset)
    }

    /// A cache over `window` whose kept positions are `rows` (time order,
    /// at most `window` of them, the last of `offset`).
    pub fn from_raw(window: usize, rows: Option<[Array; 2]>, offset: usize) -> Self {
        let len = rows.as_ref().map_or(0, |r| rows_of(&r[0]));
        Self {
            window,
            rows: Rows::from_parts(rows, len),
            offset,
        }
    }
}

impl LayerCache for RotatingKvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        let all = match self.rows.arrays() {
            None => [keys.clone(), values.clone()],
            Some(old) => concat_rows(old, [keys, values])?,
        };
        self.offset += rows_of(keys);
        let len = rows_of(&all[0]);
        if len > self.window {
            self.rows
                .set(all.each_ref().map(|a| slice(a, len - self.window, len)));
        } else {
            self.rows.set(all.clone());
        }
        Ok(pair(all))
    }

    fn can_trim(&self, n: usize) -> bool {
        // Dropping nothing is exact even after the window rotated.
        n == 0 || (n <= self.offset && self.offset <= self.window)
    }

    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        n == 0 || (n <= self.offset + append && self.offset + append <= self.window)
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "sliding window of {} already rotated (offset {})",
                    self.window, self.offset
                ),
            });
        }
        if n == 0 {
            return Ok(());
        }
        let keep = self.offset - n;
        if let Some(arrays) = self.rows.arrays() {
            let kept = arrays.each_ref().map(|a| slice(a, 0, keep));
            self.rows.set(kept);
        }
        self.offset = keep;
        Ok(())
    }

    fn window(&self) -> Option<usize> {
        Some(self.window)
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

    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        Ok(Some(CacheState {
            kind: CacheKind::Window(self.window),
            rows: self.rows.arrays().map(|a| a.to_vec()),
            offset: self.offset,
        }))
    }

    /// Keeps the last `window` of the rows given.
    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if state.kind != CacheKind::Window(self.window) {
            return None;
        }
        let rows = match state.rows {
            Some(rows) => {
                let rows = <[Array; 2]>::try_from(rows).ok()?;
                let t = rows_of(&rows[0]);
                Some(rows.map(|a| slice(&a, t.saturating_sub(self.window), t)))
            }
            None => None,
        };
        Some(Box::new(Self::from_raw(self.window, rows, state.offset)))
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

    #[test]
    fn rotating_cache_reports_when_it_can_no_longer_trim() {
        let mut c = RotatingKvCache::new(4);
        c.update_and_fetch(&step(3, 1.0), &step(3, 1.0))
            .expect("update");
        assert!(c.can_trim(2));
        assert!(
            c.can_trim_after(1, 2) && !c.can_trim_after(2, 1),
            "appending past the window rotates it"
        );
        c.trim(1).expect("trim within window");
        assert_eq!(c.offset(), 2);
        c.update_and_fetch(&step(3, 2.0), &step(3, 2.0))
            .expect("update");
        assert_eq!(c.offset(), 5);
        assert!(!c.can_trim(1), "a rotated window cannot roll back");
        assert!(c.trim(1).is_err());
        assert!(c.can_trim(0) && c.can_trim_after(2, 0));
        c.trim(0).expect("dropping nothing from a rotated window");
        assert_eq!(c.offset(), 5, "trim(0) keeps the offset");
        let (k, _) = c
            .update_and_fetch(&step(1, 3.0), &step(1, 3.0))
            .expect("update");
        assert_eq!(k.shape(), &[1, 2, 5, 4], "the window plus the new token");
    }
}
