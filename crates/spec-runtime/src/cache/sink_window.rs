//! `SinkWindowKvCache`: a cache bounded to `size` positions that keeps the
//! first `sinks` for good (`--max-kv-size`; mlx-lm's `RotatingKVCache` with
//! `keep = 4`). A query at position `p` sees positions `0..sinks` and the
//! last `size - sinks` up to `p` (every position while `p < size`): what
//! mlx-lm's single-token step sees once its ring wraps, for every query,
//! so a prompt's chunking, a verify window or a batch never changes which
//! keys a query sees, and rolling back the last forward's tokens is exact
//! whatever the offset.
//!
//! Layout: one buffer whose rows `0..sinks` are the first positions; past
//! them, rows no query needs any more (`dead`), then the live rows up to
//! the offset, in time order: past the sinks, one run of positions. An
//! update appends and hands out the whole buffer, the sinks first and the
//! run ending at its last new position (the layout `mask::sink_window_mask`
//! takes: the model's mask hides the dead rows, whose zero probabilities
//! leave every sum as it is), and marks the rows before its first query's
//! window dead; once `STEP` rows are dead the buffer is rebuilt without
//! them (a copy every `STEP` positions rather than one a step), so it holds
//! at most about `size + STEP` rows and the window of the last update.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

use super::buffer::STEP;
use super::{check_update, rows_of, slice, try_map, Rows};

/// How many first positions `--max-kv-size` keeps (mlx-lm's `keep`).
pub const MAX_KV_SINKS: usize = 4;

/// The flag that bounds the llama family's caches.
pub const MAX_KV_OPTION: &str = "--max-kv-size";

/// A KV cache of at most `size` positions keeping the first `sinks`.
#[derive(Debug, Clone)]
pub struct SinkWindowKvCache {
    size: usize,
    sinks: usize,
    rows: Rows<2>,
    /// Positions past the sinks no longer in the buffer.
    dropped: usize,
    /// Rows past the sinks still in the buffer but needed by no query.
    dead: usize,
}

impl SinkWindowKvCache {
    /// An empty cache over `size` positions keeping the first `sinks`; the
    /// caller checked `size > sinks`.
    pub fn new(size: usize, sinks: usize) -> Self {
        Self {
            size: size.max(sinks + 1),
            sinks,
            rows: Rows::default(),
            dropped: 0,
            dead: 0,
        }
    }

    /// The first position past the sinks a query at `p` sees.
    fn needed(&self, p: usize) -> usize {
        self.sinks
            .max((p + 1).saturating_sub(self.size - self.sinks))
    }

    /// The first position past the sinks the buffer still holds.
    fn first_held(&self) -> usize {
        self.sinks + self.dropped + self.dead
    }

    /// The first position past the sinks kept for a query at `p`: the one
    /// it needs, and one more, so that a file in mlx-lm's form holds
    /// `size` positions.
    fn keep_from(&self, p: usize) -> usize {
        self.needed(p).saturating_sub(1).max(self.sinks)
    }

    /// The keys and values in time order from position `from` on (past
    /// the sinks), after the sinks.
    fn view(&self, from: usize) -> Result<Option<[Array; 2]>, SpecError> {
        let Some(arrays) = self.rows.arrays() else {
            return Ok(None);
        };
        let len = self.rows.len();
        let at = from.saturating_sub(self.dropped).min(len);
        if at <= self.sinks {
            return Ok(Some(arrays.each_ref().map(|a| slice(a, 0, len))));
        }
        let sinks = self.sinks;
        try_map(arrays, |a| {
            Ok(concatenate(&[slice(a, 0, sinks), slice(a, at, len)], 2)?)
        })
        .map(Some)
    }

    /// A cache over `size` and `sinks` holding `rows`: the sinks, then the
    /// positions before `offset` in time order.
    fn from_ordered(
        size: usize,
        sinks: usize,
        rows: Option<[Array; 2]>,
        offset: usize,
    ) -> Option<Self> {
        let mut cache = Self::new(size, sinks);
        let held = rows.as_ref().map_or(0, |r| rows_of(&r[0]));
        if held > offset || (offset > held && held < cache.size.min(offset)) {
            return None;
        }
        if let Some(rows) = rows {
            cache.rows.set(rows);
        }
        cache.dropped = offset - held;
        Some(cache)
    }
}

impl LayerCache for SinkWindowKvCache {
    fn offset(&self) -> usize {
        self.rows.len() + self.dropped
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        check_update(keys, values)?;
        let first = self.needed(self.offset());
        if self.offset() > self.sinks && first < self.first_held() {
            return Err(SpecError::Internal(
                "a bounded KV cache lost rows its next query needs",
            ));
        }
        let keep_from = self.keep_from(self.offset());
        self.rows.append([keys, values])?;
        self.dead = keep_from
            .saturating_sub(self.sinks + self.dropped)
            .max(self.dead);
        if self.dead >= STEP {
            let kept = self
                .view(keep_from)?
                .ok_or(SpecError::Internal("bounded KV cache buffers missing"))?;
            self.rows.set(kept);
            self.dropped += self.dead;
            self.dead = 0;
        }
        let [k, v] = self
            .rows
            .valid()
            .ok_or(SpecError::Internal("bounded KV cache buffers missing"))?;
        Ok((k, v))
    }

    fn can_trim(&self, n: usize) -> bool {
        n <= self.offset() && self.keep_from(self.offset() - n) >= self.first_held()
    }

    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        let offset = self.offset();
        if n > offset + append {
            return false;
        }
        if append == 0 {
            return self.can_trim(n);
        }
        // The update marks the rows before its first query's dead.
        let first_held = self.first_held().max(self.keep_from(offset));
        self.keep_from(offset + append - n) >= first_held
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "a KV cache bounded to {} positions holds positions from {} at offset {}",
                    self.size,
                    self.first_held(),
                    self.offset()
                ),
            });
        }
        self.rows.trim(n)
    }

    fn window(&self) -> Option<usize> {
        Some(self.size)
    }

    fn nbytes(&self) -> usize {
        self.rows.nbytes()
    }

    /// The held positions since the last one dropped, in time order: every
    /// position until the window first moves, then the recent ones alone
    /// (the sinks before them are not their neighbours).
    fn contents(&self) -> Option<(Array, Array)> {
        let arrays = self.rows.arrays()?;
        let from = if self.dropped + self.dead > 0 {
            self.sinks + self.dead
        } else {
            0
        };
        let len = self.rows.len();
        let [k, v] = arrays.each_ref().map(|a| slice(a, from, len));
        Some((k, v))
    }

    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(self.clone()))
    }

    /// `SinkWindow`: the sinks, then the held positions in time order (at
    /// least the last `size - sinks`).
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        let offset = self.offset();
        let from = if offset > self.size {
            offset - (self.size - self.sinks)
        } else {
            self.sinks
        };
        Ok(Some(CacheState {
            kind: CacheKind::SinkWindow {
                size: self.size,
                sinks: self.sinks,
            },
            rows: self.view(from.max(self.first_held()))?.map(Vec::from),
            offset,
        }))
    }

    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        let want = CacheKind::SinkWindow {
            size: self.size,
            sinks: self.sinks,
        };
        if state.kind != want {
            return None;
        }
        let rows = match state.rows {
            Some(rows) => Some(<[Array; 2]>::try_from(rows).ok()?),
            None => None,
        };
        Self::from_ordered(self.size, self.sinks, rows, state.offset)
            .map(|c| Box::new(c) as Box<dyn LayerCache>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(values: &[f32]) -> Array {
        Array::from_slice(values, &[1, 1, values.len() as i32, 1])
    }

    fn read(a: &Array) -> Vec<f32> {
        a.flatten(None, None)
            .expect("flatten")
            .as_slice::<f32>()
            .to_vec()
    }

    /// The positions a query at `p` sees.
    fn seen(p: usize, size: usize, sinks: usize) -> Vec<usize> {
        (0..=p)
            .filter(|&q| q < sinks || p - q < size - sinks)
            .collect()
    }

    /// Random updates of 1..40 positions and random rollbacks of the last
    /// update, against the full history: each update hands out the sinks
    /// and then one run of positions ending at the last new one that holds
    /// every position its first query sees (the layout the mask assumes),
    /// rolled-back rows never come back, and the buffer stays bounded.
    #[test]
    fn every_update_hands_out_what_its_queries_see_through_rollbacks() {
        for (size, sinks) in [(5usize, 4usize), (8, 4), (12, 4), (9, 0), (300, 4)] {
            let mut cache = SinkWindowKvCache::new(size, sinks);
            let mut history: Vec<f32> = Vec::new();
            let mut state = 0x2545_F491u64 ^ size as u64;
            let mut next = |n: u64| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) % n
            };
            for generation in 0..700 {
                let s = [1, 1, 1, 2, 3, 5, 9, 17, 40][next(9) as usize];
                let start = history.len();
                assert!(cache.can_trim_after(s, s), "{size}/{sinks}: roll back {s}");
                let new: Vec<f32> = (0..s)
                    .map(|i| ((start + i) * 1000 + generation % 1000) as f32)
                    .collect();
                let (k, v) = cache
                    .update_and_fetch(&rows(&new), &rows(&new))
                    .expect("update");
                history.extend_from_slice(&new);
                assert_eq!(read(&k), read(&v));
                let got = read(&k);
                let kept = sinks.min(got.len());
                let run = history.len() - (got.len() - kept);
                let want: Vec<f32> = (0..kept)
                    .chain(run..history.len())
                    .map(|p| history[p])
                    .collect();
                assert_eq!(got, want, "{size}/{sinks} gen {generation}");
                let first = seen(start, size, sinks);
                assert!(
                    first.iter().all(|&p| p < kept || p >= run),
                    "{size}/{sinks} gen {generation}: the first query's keys are held"
                );
                assert!(
                    cache.rows.capacity() <= size + s + 2 * STEP,
                    "bounded: {} rows",
                    cache.rows.capacity()
                );
                let n = next(s as u64 + 1) as usize;
                assert!(cache.can_trim(n), "{size}/{sinks}: trim {n} of {s}");
                cache.trim(n).expect("trim");
                history.truncate(history.len() - n);
                assert_eq!(cache.offset(), history.len());
            }
        }
    }

    #[test]
    fn a_rollback_past_what_it_holds_is_refused_and_changes_nothing() {
        let mut cache = SinkWindowKvCache::new(6, 4);
        for i in 0..20 {
            let r = rows(&[i as f32]);
            cache.update_and_fetch(&r, &r).expect("update");
        }
        assert!(cache.can_trim(1));
        assert!(!cache.can_trim(5), "position 14 is gone");
        assert!(cache.trim(5).is_err());
        assert_eq!(cache.offset(), 20);
        let r = rows(&[20.0]);
        let (k, _) = cache.update_and_fetch(&r, &r).expect("update");
        // The sinks, then a run of positions to 20 (the mask hides those
        // before 19).
        let got = read(&k);
        assert_eq!(got[..4], [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(got[got.len() - 2..], [19.0, 20.0]);
        let run = &got[4..];
        assert!(run.windows(2).all(|w| w[1] == w[0] + 1.0), "{got:?}");
    }

    #[test]
    fn its_state_restores_the_same_keys() {
        let mut cache = SinkWindowKvCache::new(7, 4);
        let r = rows(&(0..30).map(|i| i as f32).collect::<Vec<_>>());
        cache.update_and_fetch(&r, &r).expect("prefill");
        let state = cache.state().expect("state").expect("some");
        assert_eq!(state.offset, 30);
        let held = read(&state.rows.as_ref().expect("rows")[0]);
        assert_eq!(held, vec![0.0, 1.0, 2.0, 3.0, 27.0, 28.0, 29.0]);
        let mut back = SinkWindowKvCache::new(7, 4)
            .restored(state)
            .expect("restored");
        let n = rows(&[30.0]);
        let (a, _) = cache.update_and_fetch(&n, &n).expect("next");
        let (b, _) = back.update_and_fetch(&n, &n).expect("next");
        let tail = |v: Vec<f32>| v[v.len() - 3..].to_vec();
        assert_eq!(tail(read(&a)), tail(read(&b)));
        assert_eq!(read(&b), vec![0.0, 1.0, 2.0, 3.0, 27.0, 28.0, 29.0, 30.0]);
    }
}
