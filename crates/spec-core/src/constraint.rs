//! Constraints on what a request may generate (a grammar, a JSON schema, a
//! regex): the serve loop's side of constrained decoding. A constraint is
//! a per-request part of the loop beside the provider; it sees only
//! committed tokens, and answers questions about drafts without advancing.

use mlx_rs::ops::select;
use mlx_rs::Array;

use crate::SpecError;

/// The tokens allowed at one position: a bit per token id (ids past
/// [`TokenMask::len`] are refused), and whether the request may end there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    bits: Vec<u32>,
    len: usize,
    /// Whether the constraint is satisfied here, so an end-of-sequence
    /// token may follow (the request's own EOS ids are allowed then).
    pub end_allowed: bool,
}

impl TokenMask {
    /// A mask over `len` ids from 32-bit words (bit `i % 32` of word
    /// `i / 32` allows id `i`); words past `len` are ignored.
    pub fn from_words(words: Vec<u32>, len: usize, end_allowed: bool) -> Self {
        let mut bits = words;
        bits.resize(len.div_ceil(32), 0);
        if !len.is_multiple_of(32) {
            if let Some(last) = bits.last_mut() {
                *last &= (1u32 << (len % 32)) - 1;
            }
        }
        Self {
            bits,
            len,
            end_allowed,
        }
    }

    /// A mask allowing exactly `ids` among `len`.
    pub fn of_ids(ids: &[u32], len: usize, end_allowed: bool) -> Self {
        let mut bits = vec![0u32; len.div_ceil(32)];
        for &id in ids {
            if (id as usize) < len {
                bits[id as usize / 32] |= 1 << (id % 32);
            }
        }
        Self {
            bits,
            len,
            end_allowed,
        }
    }

    /// The ids the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no id.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `id` is allowed.
    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.len && self.bits[id as usize / 32] & (1 << (id % 32)) != 0
    }

    /// Allows `id` as well (the request's EOS ids where the constraint may end).
    pub fn allow(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.bits[id as usize / 32] |= 1 << (id % 32);
        }
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The mask as MLX booleans over `vocab` ids (ids past the mask
    /// refused), expanded a 32-bit word at a time.
    pub fn to_array(&self, vocab: usize) -> Array {
        let mut allowed = vec![false; vocab];
        for (chunk, &word) in allowed.chunks_mut(32).zip(&self.bits) {
            for (bit, slot) in chunk.iter_mut().enumerate() {
                *slot = (word >> bit) & 1 != 0;
            }
        }
        Array::from_slice(&allowed, &[vocab as i32])
    }

    /// `logits` (`[.., V]`) with every refused id at negative infinity, in
    /// the logits' own dtype. A vocabulary wider than the mask (a model's
    /// padded embedding) refuses the ids past it.
    pub fn apply(&self, logits: &Array) -> Result<Array, SpecError> {
        self.select(&self.to_array(last_dim(logits)), logits)
    }

    /// `logits` where `allowed`, negative infinity elsewhere.
    fn select(&self, allowed: &Array, logits: &Array) -> Result<Array, SpecError> {
        self.check_nonempty()?;
        let refused = Array::from_f32(f32::NEG_INFINITY).as_dtype(logits.dtype())?;
        Ok(select(allowed, logits, &refused)?)
    }

    /// The mask's 32-bit words (bit `i % 32` of word `i / 32` allows id
    /// `i`), for a host that applies it itself.
    pub fn words(&self) -> &[u32] {
        &self.bits
    }

    /// Errors if the mask allows no token (nothing could be sampled).
    pub fn check_nonempty(&self) -> Result<(), SpecError> {
        if self.count() == 0 {
            return Err(SpecError::Constraint(
                "the token mask allows no token".into(),
            ));
        }
        Ok(())
    }
}

/// The width of `logits`' last axis.
fn last_dim(logits: &Array) -> usize {
    logits.shape().last().copied().unwrap_or(0).max(0) as usize
}

/// A request's constraint: which tokens it may generate next, given the
/// tokens it committed. The serve loop validates drafts with it before
/// verification (cutting each at its first refused token), masks every
/// verified position with the state that position has, takes forced
/// continuations as free drafts, and commits only emitted tokens (never an
/// EOS, which ends the request). Every method but `commit` leaves the
/// state as it found it.
pub trait Constraint: Send {
    /// How many leading `tokens` are allowed, one after another, from the
    /// current state.
    fn validate(&mut self, tokens: &[u32]) -> Result<usize, SpecError>;

    /// The tokens the constraint forces after `prefix` (which it allows):
    /// the only continuation it admits, canonically tokenized, at most
    /// `max` of them; empty where it admits a choice.
    fn forced(&mut self, prefix: &[u32], max: usize) -> Result<Vec<u32>, SpecError>;

    /// The masks of the positions after each prefix of `tokens` (which it
    /// allows): `tokens.len() + 1` masks, the first for the current state.
    fn masks(&mut self, tokens: &[u32]) -> Result<Vec<TokenMask>, SpecError>;

    /// Advances over committed `tokens`.
    fn commit(&mut self, tokens: &[u32]) -> Result<(), SpecError>;

    /// Whether the constraint is complete: nothing but the end may follow.
    fn is_complete(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_refuse_what_they_do_not_name() {
        let mut m = TokenMask::of_ids(&[1, 33, 40], 35, false);
        assert!(m.allows(1) && m.allows(33));
        assert!(
            !m.allows(0) && !m.allows(40),
            "40 is past the mask's 35 ids"
        );
        m.allow(2);
        assert_eq!(m.count(), 3);
        let words = TokenMask::from_words(vec![u32::MAX, u32::MAX], 35, true);
        assert_eq!(words.count(), 35);

        let logits = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 4]);
        let out = TokenMask::of_ids(&[1, 3], 3, false)
            .apply(&logits)
            .expect("apply");
        assert_eq!(
            out.as_slice::<f32>(),
            &[f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY],
            "3 is past the mask: refused"
        );
        assert!(TokenMask::of_ids(&[], 3, true).apply(&logits).is_err());
    }

    /// The boolean array expands the words as `allows` reads them, at the
    /// mask's width and at a wider one (ids past the mask refused).
    #[test]
    fn arrays_expand_the_words() {
        let ids = [0, 5, 31, 32, 33, 63, 64, 70, 99];
        let mask = TokenMask::of_ids(&ids, 100, false);
        assert_eq!(mask.words().len(), 4);
        for width in [100, 103] {
            let allowed = mask.to_array(width);
            let flags = allowed.as_slice::<bool>();
            assert_eq!(flags.len(), width);
            assert!((0..width).all(|i| flags[i] == mask.allows(i as u32)));
        }
        let logits = Array::from_slice(&[0.5f32; 103], &[1, 103]);
        let out = mask.apply(&logits).expect("apply");
        let kept = out
            .as_slice::<f32>()
            .iter()
            .filter(|v| v.is_finite())
            .count();
        assert_eq!(kept, ids.len());
    }
}
