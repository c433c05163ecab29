//! The sliding-window cache of the sliding layers (Gemma-4's, the llama
//! family's: Ministral, gpt-oss): the buffer layout of mlx-lm's
//! `RotatingKVCache` (keep 0), plus exact rollback past the window.
//! Keys and values always reach the attention in time order (mlx-lm hands a
//! single token its wrapped ring in storage order; our oracles make it use
//! time order too, `xtask/python/row_order.py`), so a query's bits do not
//! depend on whether it runs alone or inside a verify window.
//!
//! Layout, as mlx-lm keeps it: a multi-token update concatenates (the buffer
//! keeps the last `window - 1` positions plus the new ones, in time order); a
//! single-token update writes into a ring of `window` slots. `held` counts the
//! valid positions in the buffer (the most recent ones); the next query at
//! position `p` needs `p - window + 1 .. p`, so a rollback of `n` is exact
//! while `held - n >= min(offset - n, window - 1)`. After a multi-token
//! verify window of `S` tokens the buffer holds `window - 1 + S` positions,
//! so any rejected suffix can be dropped however long the request is (optiq
//! rewinds its ring the same way; mlx-lm refuses once `offset >= window`).
//! Rolled-back slots stay in the buffer until the next update drops or
//! overwrites them.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

use super::{check_update, concat_rows, rows_of, slice, try_map, Rows};

/// A sliding-window KV cache with mlx-lm's buffer layout and exact rollback.
#[derive(Debug, Clone)]
pub struct SlidingKvCache {
    window: usize,
    /// Keys and values; the cursor is mlx-lm's `_idx`: the write position
    /// (ring) or the used length (concatenated). Growth stops at the window.
    rows: Rows<2>,
    offset: usize,
    /// Valid (not rolled-back) positions in the buffer, the most recent ones.
    held: usize,
}

impl SlidingKvCache {
    /// An empty cache over a window of `window` positions (`window >= 1`).
    pub fn new(window: usize) -> Self {
        let window = window.max(1);
        Self {
            window,
            rows: Rows::with_limit(window),
            offset: 0,
            held: 0,
        }
    }

    /// A cache over `window` holding `rows` (time order, every row valid:
    /// the last positions before `offset`), as read from a file.
    fn from_ordered(window: usize, rows: Option<[Array; 2]>, offset: usize) -> Self {
        let mut cache = Self::new(window);
        if let Some(rows) = rows {
            cache.rows.set(rows);
        }
        cache.held = cache.rows.len();
        cache.offset = offset;
        cache
    }

    /// Unrolls the buffer into time order, leaving out rolled-back slots.
    fn ordered(&self) -> Result<Option<[Array; 2]>, SpecError> {
        let Some(arrays) = self.rows.arrays() else {
            return Ok(None);
        };
        let (idx, len) = (self.rows.len(), self.rows.capacity());
        let order = |a: &Array| -> Result<Array, SpecError> {
            if self.held == idx {
                // Linear: the valid rows are the first `idx`.
                return Ok(if idx == len {
                    a.clone()
                } else {
                    slice(a, 0, idx)
                });
            }
            // A ring: the oldest valid slot follows the write position and
            // the rolled-back slots (`len - held` of them) right after it.
            let start = (idx + len.saturating_sub(self.held)).min(len);
            let older = slice(a, start, len);
            let newer = slice(a, 0, idx);
            Ok(concatenate(&[older, newer], 2)?)
        };
        try_map(arrays, order).map(Some)
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array), SpecError> {
        let s = rows_of(keys);
        let [k, v] = match self.ordered()? {
            Some(old) => {
                // Keep `window - 1` old positions: every new token still sees
                // a full window.
                let drop = self.held.saturating_sub(self.window - 1);
                let kept = if drop > 0 {
                    old.each_ref().map(|a| slice(a, drop, self.held))
                } else {
                    old
                };
                concat_rows(&kept, [keys, values])?
            }
            None => [keys.clone(), values.clone()],
        };
        self.offset += s;
        self.rows.set([k.clone(), v.clone()]);
        self.held = self.rows.len();
        Ok((k, v))
    }

    fn update_in_place(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        let idx = self.rows.len();
        if let Some(arrays) = self.rows.arrays() {
            if self.rows.capacity() > self.window && idx < self.rows.capacity() {
                // A concatenated buffer with a rolled-back tail: drop the tail
                // before the ring logic (mlx-lm would keep it as valid).
                let kept = arrays.each_ref().map(|a| slice(a, 0, idx));
                self.rows.set(kept);
            }
        }
        let len = self.rows.capacity();
        if self.rows.arrays().is_none() || (self.offset >= len && len < self.window) {
            if let Some(arrays) = self.rows.arrays().filter(|_| self.offset > len) {
                // Positions before the buffer were dropped (a rollback after
                // rotation): append and continue as a full ring.
                let [k, v] = concat_rows(arrays, [keys, values])?;
                self.offset += 1;
                self.rows.set([k.clone(), v.clone()]);
                self.held = self.rows.len();
                return Ok((k, v));
            }
            // The ring grows (mlx-lm's step, up to the window) on this write.
            self.rows.seek(self.offset);
        }
        let len = self.rows.capacity();
        if len > self.window {
            if let Some(arrays) = self.rows.arrays() {
                let cut = arrays.each_ref().map(|a| slice(a, len - self.window, len));
                self.rows.set(cut);
            }
            self.held = self.held.min(self.window);
        }
        if self.rows.len() == self.window {
            self.rows.seek(0);
        }
        self.rows.append([keys, values])?;
        self.offset += 1;
        let len = self.rows.capacity();
        self.held = (self.held + 1).min(len).min(self.offset);
        let Some([k, v]) = self.rows.arrays() else {
            return Err(SpecError::Internal("sliding cache buffers missing"));
        };
        if self.offset < len {
            return Ok((slice(k, 0, self.offset), slice(v, 0, self.offset)));
        }
        // A wrapped ring goes out in time order, as a multi-token window's
        // keys do: attention sums over keys in the order given, so a query
        // gets the same bits alone and inside a verify window.
        let [k, v] = self
            .ordered()?
            .ok_or(SpecError::Internal("sliding cache buffers missing"))?;
        Ok((k, v))
    }

    /// Valid positions held after appending `append` tokens.
    fn held_after(&self, append: usize) -> usize {
        match append {
            0 => self.held,
            // The ring (or its growth before it first fills) gains one slot.
            1 => (self.held + 1).min(self.window),
            // A concatenation keeps `window - 1` old positions.
            _ => self.held.min(self.window - 1) + append,
        }
    }

    fn exact_after(&self, held: usize, offset: usize, n: usize) -> bool {
        n <= offset && n <= held && held - n >= (offset - n).min(self.window - 1)
    }
}

impl LayerCache for SlidingKvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        check_update(keys, values)?;
        match rows_of(keys) {
            1 => self.update_in_place(keys, values),
            _ => self.update_concat(keys, values),
        }
    }

    fn can_trim(&self, n: usize) -> bool {
        // The ring's write position moves back with the rollback.
        self.exact_after(self.held, self.offset, n) && n <= self.rows.len()
    }

    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        self.exact_after(self.held_after(append), self.offset + append, n)
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "sliding window of {} holds {} positions at offset {}",
                    self.window, self.held, self.offset
                ),
            });
        }
        self.rows.trim(n)?;
        self.offset -= n;
        self.held -= n;
        Ok(())
    }

    fn window(&self) -> Option<usize> {
        Some(self.window)
    }

    fn nbytes(&self) -> usize {
        self.rows.nbytes()
    }

    /// The valid keys and values in time order (`[B, heads, T, D]`, the
    /// positions `offset - T .. offset`).
    fn contents(&self) -> Option<(Array, Array)> {
        let [k, v] = self.ordered().ok()??;
        Some((k, v))
    }

    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(self.clone()))
    }

    /// `Window`: the valid positions in time order, rolled-back slots left
    /// out.
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        Ok(Some(CacheState {
            kind: CacheKind::Window(self.window),
            rows: self.ordered()?.map(Vec::from),
            offset: self.offset,
        }))
    }

    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if state.kind != CacheKind::Window(self.window) {
            return None;
        }
        let rows = match state.rows {
            Some(rows) => Some(<[Array; 2]>::try_from(rows).ok()?),
            None => None,
        };
        Some(Box::new(Self::from_ordered(
            self.window,
            rows,
            state.offset,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys `[1, 1, S, 1]` whose values name their content.
    fn rows(values: &[f32]) -> Array {
        Array::from_slice(values, &[1, 1, values.len() as i32, 1])
    }

    fn read(a: &Array) -> Vec<f32> {
        a.flatten(None, None)
            .expect("flatten")
            .as_slice::<f32>()
            .to_vec()
    }

    /// Random updates of 1..9 positions and random rollbacks of the last
    /// update, checked against the full history: what each update returns
    /// (the layout the model's masks assume), the time-ordered view, and
    /// that rolled-back rows never come back.
    #[test]
    fn rollback_past_the_window_is_exact_in_every_layout() {
        for window in [1usize, 2, 5, 8] {
            let mut cache = SlidingKvCache::new(window);
            let mut history: Vec<f32> = Vec::new();
            let mut state = 0x9E37_79B9u64 ^ window as u64;
            let mut next = |n: u64| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) % n
            };
            for generation in 0..300 {
                let s = [1, 1, 1, 2, 3, 5, 9][next(7) as usize];
                let start = history.len();
                assert!(
                    cache.can_trim_after(s, s),
                    "window {window}: a round of {s} must be able to roll back"
                );
                // Values tag the generation: a stale rolled-back row differs.
                let new: Vec<f32> = (0..s)
                    .map(|i| ((start + i) * 1000 + generation % 1000) as f32)
                    .collect();
                let (k, v) = cache
                    .update_and_fetch(&rows(&new), &rows(&new))
                    .expect("update");
                history.extend_from_slice(&new);
                let (got, got_v) = (read(&k), read(&v));
                assert_eq!(got, got_v);
                if s > 1 {
                    let from = start.saturating_sub(window - 1);
                    assert_eq!(
                        got,
                        history[from..],
                        "window {window} gen {generation}: concatenated update"
                    );
                } else {
                    let from = history.len().saturating_sub(window);
                    let mut sorted = got.clone();
                    sorted.sort_by(f32::total_cmp);
                    let mut want = history[from..].to_vec();
                    want.sort_by(f32::total_cmp);
                    assert_eq!(
                        sorted, want,
                        "window {window} gen {generation}: ring update holds the window"
                    );
                }
                let (ok, _) = cache.contents().expect("state");
                let held = read(&ok);
                assert!(held.len() >= history.len().min(window - 1));
                assert_eq!(
                    held,
                    history[history.len() - held.len()..],
                    "window {window} gen {generation}: ordered view"
                );
                let n = next(s as u64 + 1) as usize;
                assert!(
                    cache.can_trim(n),
                    "window {window}: rolling back {n} of the {s} just appended"
                );
                cache.trim(n).expect("trim");
                history.truncate(history.len() - n);
                assert_eq!(cache.offset(), history.len());
            }
        }
    }

    #[test]
    fn a_rotated_ring_refuses_rollbacks_it_cannot_do_exactly() {
        let mut cache = SlidingKvCache::new(4);
        for i in 0..10 {
            cache
                .update_and_fetch(&rows(&[i as f32]), &rows(&[i as f32]))
                .expect("update");
        }
        assert!(
            cache.can_trim(1),
            "the overwritten slot was outside the next query's window"
        );
        assert!(
            !cache.can_trim(2),
            "position 6 was overwritten and the query at 8 needs it"
        );
        assert!(cache.trim(2).is_err());
        assert_eq!(cache.offset(), 10, "a refused trim changes nothing");
        assert!(!cache.can_trim_after(1, 2) && cache.can_trim_after(3, 3));
    }
}
