//! The cache of a Gated DeltaNet layer (mlx-lm's `ArraysCache(size=2)`):
//! the conv state (the last `kernel - 1` conv inputs) and the recurrent
//! state (`[B, value_heads, value_dim, key_dim]`, float32). Both fold every
//! token seen into a fixed size, so nothing can be taken back: `trim` works
//! only for zero tokens, and a speculative round, which must roll back its
//! rejected drafts, cannot run over it (the serve loop refuses a provider on
//! such a target; see `can_trim_after`).

use mlx_rs::Array;
use spec_core::{LayerCache, SpecError};

/// A Gated DeltaNet layer's states.
#[derive(Debug, Default, Clone)]
pub struct DeltaCache {
    conv: Option<Array>,
    recurrent: Option<Array>,
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
        (self.conv.as_ref(), self.recurrent.as_ref())
    }

    /// Stores the states after `tokens` more tokens.
    pub fn advance(&mut self, conv: Array, recurrent: Array, tokens: usize) {
        self.conv = Some(conv);
        self.recurrent = Some(recurrent);
        self.offset += tokens;
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
        n == 0
    }

    fn can_trim_after(&self, _append: usize, n: usize) -> bool {
        n == 0
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if n == 0 {
            return Ok(());
        }
        Err(SpecError::Trim {
            requested: n,
            reason: "a Gated DeltaNet layer's recurrent state cannot be rolled back".into(),
        })
    }

    fn nbytes(&self) -> usize {
        self.conv.as_ref().map_or(0, Array::nbytes)
            + self.recurrent.as_ref().map_or(0, Array::nbytes)
    }

    fn contents(&self) -> Option<(Array, Array)> {
        None
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_trim_succeeds_and_nothing_changes() {
        let mut c = DeltaCache::new();
        c.advance(Array::from_f32(1.0), Array::from_f32(2.0), 3);
        assert!(c.can_trim(0) && !c.can_trim(1) && !c.can_trim_after(2, 1));
        assert!(c.trim(0).is_ok());
        let e = c.trim(1).expect_err("trimmed a recurrent state");
        assert!(e.to_string().contains("cannot be rolled back"), "{e}");
        assert_eq!(c.offset(), 3);
        assert!(c.duplicate().is_none() && c.contents().is_none());
        assert!(c
            .update_and_fetch(&Array::from_f32(0.0), &Array::from_f32(0.0))
            .is_err());
    }
}
