//! The cache of a Gated DeltaNet layer (mlx-lm's `ArraysCache(size=2)`):
//! the conv state (the last `kernel - 1` conv inputs) and the recurrent
//! state (`[B, value_heads, value_dim, key_dim]`, float32). Both fold every
//! token seen into a fixed size, so a token cannot be taken back out of
//! them; the cache rolls back instead by keeping the states each position
//! left, back to the last commit ([`LayerCache::commit`]): the recurrence
//! computes them one position at a time anyway, so a rolled-back cache
//! holds the very bits a cache that never saw the dropped tokens holds.
//! It keeps at most [`ROLLBACK_LIMIT`] positions' states (the oldest go
//! first), which bounds what an uncommitted run of steps can hold: one
//! position costs [`DeltaCache::position_bytes`]. A copy (`duplicate`, for
//! the prefix cache) holds the last states only: it serves exactly the
//! tokens it holds.

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
    /// The states after each earlier token back to the last commit, oldest
    /// first: `past[past.len() - n]` is what `trim(n)` restores (`None`:
    /// the states before the first token).
    past: VecDeque<Option<DeltaStates>>,
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

    /// Stores the states after each of `positions` more tokens, in order
    /// (the last is the cache's state from now on).
    pub fn advance(&mut self, positions: Vec<DeltaStates>) {
        for states in positions {
            let before = self.now.replace(states);
            self.past.push_back(before);
            self.offset += 1;
        }
        while self.past.len() > ROLLBACK_LIMIT {
            self.past.pop_front();
        }
    }

    /// Positions the cache can roll back now.
    pub fn rollback_depth(&self) -> usize {
        self.past.len()
    }

    /// Bytes one position's states hold (what each position a cache can
    /// roll back costs), `0` before the first token.
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
        n <= self.past.len()
    }

    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        n <= (self.past.len() + append).min(ROLLBACK_LIMIT)
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if n == 0 {
            return Ok(());
        }
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "a Gated DeltaNet layer keeps its states for the last {} uncommitted tokens only",
                    self.past.len()
                ),
            });
        }
        let keep = self.past.len() - n;
        self.now = self.past.drain(keep..).next().flatten();
        self.offset -= n;
        Ok(())
    }

    fn commit(&mut self, keep: usize) {
        while self.past.len() > keep {
            self.past.pop_front();
        }
    }

    fn nbytes(&self) -> usize {
        self.now.as_ref().map_or(0, DeltaStates::nbytes)
            + self
                .past
                .iter()
                .flatten()
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
        c.advance(vec![states(1.0), states(2.0), states(3.0)]);
        assert_eq!((c.offset(), now(&c)), (3, Some(3.0)));
        assert!(c.can_trim(3) && !c.can_trim(4));
        c.trim(2).expect("trim");
        assert_eq!((c.offset(), now(&c)), (1, Some(1.0)));
        c.advance(vec![states(4.0)]);
        assert_eq!((c.offset(), now(&c), c.rollback_depth()), (2, Some(4.0), 2));
        c.trim(2).expect("back to the start");
        assert_eq!((c.offset(), now(&c)), (0, None));
        assert!(c.trim(1).is_err());
    }

    #[test]
    fn a_commit_frees_older_states_and_a_refused_trim_changes_nothing() {
        let mut c = DeltaCache::new();
        c.advance(vec![states(1.0), states(2.0)]);
        c.advance(vec![states(3.0), states(4.0)]);
        let one = c.position_bytes();
        assert_eq!(c.nbytes(), 4 * one, "the state before the first is zero");
        c.commit(1);
        assert_eq!((c.rollback_depth(), c.nbytes()), (1, 2 * one));
        let e = c.trim(2).expect_err("trimmed past the commit");
        assert!(e.to_string().contains("last 1 uncommitted"), "{e}");
        assert_eq!((c.offset(), now(&c)), (4, Some(4.0)));
        assert!(c.can_trim_after(3, 4) && !c.can_trim_after(3, 5));
        c.trim(1).expect("trim");
        assert_eq!((c.offset(), now(&c)), (3, Some(3.0)));
    }

    #[test]
    fn at_most_the_limit_of_positions_is_kept() {
        let mut c = DeltaCache::new();
        c.advance((0..ROLLBACK_LIMIT + 5).map(|i| states(i as f32)).collect());
        assert_eq!(c.rollback_depth(), ROLLBACK_LIMIT);
        assert!(c.can_trim(ROLLBACK_LIMIT) && !c.can_trim(ROLLBACK_LIMIT + 1));
        assert!(!c.can_trim_after(100, ROLLBACK_LIMIT + 1));
        c.trim(ROLLBACK_LIMIT).expect("trim");
        assert_eq!(now(&c), Some(4.0));
        let copy = c.duplicate().expect("a copy");
        assert_eq!((copy.offset(), copy.nbytes()), (5, c.position_bytes()));
        assert!(!copy.can_trim(1) && c.contents().is_none());
        assert!(c
            .update_and_fetch(&Array::from_f32(0.0), &Array::from_f32(0.0))
            .is_err());
    }
}
