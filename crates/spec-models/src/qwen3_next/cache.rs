//! The cache of a Gated DeltaNet layer (mlx-lm's `ArraysCache(size=2)`):
//! the conv state (the last `kernel - 1` conv inputs) and the recurrent
//! state (`[B, value_heads, value_dim, key_dim]`, float32). Both fold every
//! token seen into a fixed size, so a token cannot be taken back out of
//! them; the cache rolls back instead by keeping states it may return to,
//! back to the last commit ([`LayerCache::commit`]): the state before each
//! window (a failed step returns there) and, for decoding windows, the
//! states each of its last [`ROLLBACK_LIMIT`] positions left (a round that
//! rejects drafts returns to one). The recurrence computes them one position
//! at a time anyway, so a rolled-back cache holds the very bits a cache
//! that never saw the dropped tokens holds. At most `ROLLBACK_LIMIT + 1`
//! states are kept (the oldest go first), which bounds what an uncommitted
//! run of steps can hold: one costs [`DeltaCache::position_bytes`]. A copy
//! (`duplicate`, for the prefix cache) holds the last states only: it
//! serves exactly the tokens it holds.

use std::collections::VecDeque;

use mlx_rs::Array;
use spec_core::{CacheKind, CacheState, LayerCache, SpecError};

/// The most positions a cache can roll back: longer verify windows are
/// cut to fit by the serve loop (`can_trim_after`).
pub const ROLLBACK_LIMIT: usize = 48;

/// A layer's states after some position.
#[derive(Debug, Clone)]
pub struct DeltaStates {
    /// The last `kernel - 1` conv inputs, `[B, kernel - 1, channels]`.
    pub conv: Array,
    /// The recurrent state, `[B, value_heads, value_dim, key_dim]`.
    pub recurrent: Array,
}

impl DeltaStates {
    fn nbytes(&self) -> usize {
        self.conv.nbytes() + self.recurrent.nbytes()
    }
}

/// A Gated DeltaNet layer's states.
#[derive(Debug, Default, Clone)]
pub struct DeltaCache {
    /// The states after the last token (`None` before the first).
    now: Option<DeltaStates>,
    /// States it may roll back to, oldest first, each with the tokens seen
    /// when it held (`None`: the states before the first token).
    past: VecDeque<(usize, Option<DeltaStates>)>,
    offset: usize,
}

impl DeltaCache {
    /// An empty cache (both states zero at the first token).
    pub fn new() -> Self {
        Self::default()
    }

    /// The conv state and the recurrent state, `None` before the first
    /// token.
    pub fn states(&self) -> (Option<&Array>, Option<&Array>) {
        match &self.now {
            Some(s) => (Some(&s.conv), Some(&s.recurrent)),
            None => (None, None),
        }
    }

    /// The positions of a window of `tokens` tokens whose states a cache
    /// keeps: the last ones of a decoding window (up to the limit), the
    /// last alone of a prompt chunk (whose positions no round cuts into).
    pub fn kept(tokens: usize, decoding: bool) -> usize {
        if decoding {
            tokens.min(ROLLBACK_LIMIT)
        } else {
            tokens.min(1)
        }
    }

    /// Stores a window of `tokens` more tokens: `last` holds the states
    /// after each of its last `last.len()` positions, in order (the last is
    /// the cache's state from now on; at least one when `tokens > 0`).
    pub fn advance(&mut self, tokens: usize, last: Vec<DeltaStates>) {
        if tokens == 0 || last.is_empty() {
            return;
        }
        let base = self.offset;
        self.past.push_back((base, self.now.take()));
        let first = tokens + 1 - last.len().min(tokens);
        for (k, states) in last.into_iter().enumerate() {
            let p = first + k;
            if p < tokens {
                self.past.push_back((base + p, Some(states)));
            } else {
                self.now = Some(states);
            }
        }
        self.offset = base + tokens;
        while self.past.len() > ROLLBACK_LIMIT + 1 {
            self.past.pop_front();
        }
    }

    /// Where in `past` the state `n` tokens back is.
    fn back(&self, n: usize) -> Option<usize> {
        let at = self.offset.checked_sub(n)?;
        self.past.iter().rposition(|(o, _)| *o == at)
    }

    /// States the cache can roll back to now.
    pub fn rollback_depth(&self) -> usize {
        self.past.len()
    }

    /// Bytes one position's states hold (what each kept state costs), `0`
    /// before the first token.
    pub fn position_bytes(&self) -> usize {
        self.now.as_ref().map_or(0, DeltaStates::nbytes)
    }
}

impl LayerCache for DeltaCache {
    fn offset(&self) -> usize {
        self.offset
    }

    /// A recurrent layer keeps no keys and values: always an error.
    fn update_and_fetch(
        &mut self,
        _keys: &Array,
        _values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        Err(SpecError::Internal(
            "a Gated DeltaNet cache holds recurrent states, not keys and values",
        ))
    }

    fn can_trim(&self, n: usize) -> bool {
        n == 0 || self.back(n).is_some()
    }

    /// After a decoding window of `append` tokens: back to any of its
    /// positions within the limit, to its start, or past it to a state kept
    /// now that the window's own do not push out.
    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        if n == 0 || append == 0 {
            return self.can_trim(n);
        }
        let kept = DeltaCache::kept(append, true);
        n < kept
            || n == append
            || (n > append
                && self
                    .back(n - append)
                    .is_some_and(|j| self.past.len() - j + kept <= ROLLBACK_LIMIT + 1))
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if n == 0 {
            return Ok(());
        }
        let Some(j) = self.back(n) else {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "a Gated DeltaNet layer keeps no state {n} tokens back (it keeps the starts of its uncommitted windows and up to {ROLLBACK_LIMIT} decoding positions)"
                ),
            });
        };
        self.now = self.past.drain(j..).next().and_then(|(_, s)| s);
        self.offset -= n;
        Ok(())
    }

    fn commit(&mut self, keep: usize) {
        while self
            .past
            .front()
            .is_some_and(|(o, _)| o + keep < self.offset)
        {
            self.past.pop_front();
        }
    }

    fn nbytes(&self) -> usize {
        self.now.as_ref().map_or(0, DeltaStates::nbytes)
            + self
                .past
                .iter()
                .filter_map(|(_, s)| s.as_ref())
                .map(DeltaStates::nbytes)
                .sum::<usize>()
    }

    fn contents(&self) -> Option<(Array, Array)> {
        None
    }

    /// The states after the last token, without the ones to roll back to:
    /// a copy (a prefix-cache entry) serves its own length exactly and
    /// cannot be cut back.
    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(DeltaCache {
            now: self.now.clone(),
            past: VecDeque::new(),
            offset: self.offset,
        }))
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    /// `Recurrent`: the conv state and the recurrent state after the last
    /// token (mlx-lm's `ArraysCache` of two).
    fn state(&self) -> Result<Option<CacheState>, SpecError> {
        Ok(Some(CacheState {
            kind: CacheKind::Recurrent,
            rows: self
                .now
                .as_ref()
                .map(|s| vec![s.conv.clone(), s.recurrent.clone()]),
            offset: self.offset,
        }))
    }

    /// A cache holding `state`'s two states (the reader checked their
    /// shapes), nothing to roll back to.
    fn restored(&self, state: CacheState) -> Option<Box<dyn LayerCache>> {
        if state.kind != CacheKind::Recurrent {
            return None;
        }
        let now = match state.rows {
            Some(rows) => {
                let [conv, recurrent] = <[Array; 2]>::try_from(rows).ok()?;
                Some(DeltaStates { conv, recurrent })
            }
            None => None,
        };
        Some(Box::new(DeltaCache {
            now,
            past: VecDeque::new(),
            offset: state.offset,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(x: f32) -> DeltaStates {
        DeltaStates {
            conv: Array::from_f32(x),
            recurrent: Array::from_f32(10.0 * x),
        }
    }

    fn now(c: &DeltaCache) -> Option<f32> {
        c.states().0.map(|a| {
            a.eval().expect("eval");
            a.as_slice::<f32>()[0]
        })
    }

    #[test]
    fn a_trim_restores_the_states_an_earlier_position_left() {
        let mut c = DeltaCache::new();
        c.advance(3, vec![states(1.0), states(2.0), states(3.0)]);
        assert_eq!((c.offset(), now(&c)), (3, Some(3.0)));
        assert!(c.can_trim(3) && !c.can_trim(4));
        c.trim(2).expect("trim");
        assert_eq!((c.offset(), now(&c)), (1, Some(1.0)));
        c.advance(1, vec![states(4.0)]);
        assert_eq!((c.offset(), now(&c), c.rollback_depth()), (2, Some(4.0), 2));
        c.trim(2).expect("back to the start");
        assert_eq!((c.offset(), now(&c)), (0, None));
        assert!(c.trim(1).is_err());
    }

    #[test]
    fn a_commit_frees_older_states_and_a_refused_trim_changes_nothing() {
        let mut c = DeltaCache::new();
        c.advance(2, vec![states(1.0), states(2.0)]);
        c.advance(2, vec![states(3.0), states(4.0)]);
        let one = c.position_bytes();
        assert_eq!(c.nbytes(), 4 * one, "the state before the first is zero");
        c.commit(1);
        assert_eq!((c.rollback_depth(), c.nbytes()), (1, 2 * one));
        let e = c.trim(2).expect_err("trimmed past the commit");
        assert!(e.to_string().contains("no state 2 tokens back"), "{e}");
        assert_eq!((c.offset(), now(&c)), (4, Some(4.0)));
        assert!(c.can_trim_after(3, 4) && !c.can_trim_after(3, 5));
        c.trim(1).expect("trim");
        assert_eq!((c.offset(), now(&c)), (3, Some(3.0)));
    }

    #[test]
    fn a_prompt_chunk_keeps_its_start_and_a_long_window_its_last_positions() {
        let mut c = DeltaCache::new();
        c.advance(2, vec![states(1.0), states(2.0)]);
        c.commit(0);
        // A 100-token prompt chunk: its end, and its start to fail back to.
        c.advance(100, vec![states(102.0)]);
        assert!(c.can_trim(100) && !c.can_trim(1) && !c.can_trim(99));
        c.trim(100).expect("the chunk's start");
        assert_eq!((c.offset(), now(&c)), (2, Some(2.0)));
        // A decoding window past the limit keeps its last positions.
        let n = ROLLBACK_LIMIT + 5;
        c.advance(n, (0..ROLLBACK_LIMIT).map(|i| states(i as f32)).collect());
        assert!(c.can_trim(ROLLBACK_LIMIT - 1) && !c.can_trim(ROLLBACK_LIMIT));
        assert!(c.can_trim(n), "the window's start");
        assert!(c.can_trim_after(3, 3) && !c.can_trim_after(100, ROLLBACK_LIMIT));
        c.trim(ROLLBACK_LIMIT - 1).expect("trim");
        assert_eq!(now(&c), Some(0.0));
        let copy = c.duplicate().expect("a copy");
        assert_eq!(
            (copy.offset(), copy.nbytes()),
            (c.offset(), c.position_bytes())
        );
        assert!(!copy.can_trim(1) && c.contents().is_none());
        assert!(c
            .update_and_fetch(&Array::from_f32(0.0), &Array::from_f32(0.0))
            .is_err());
    }
}
