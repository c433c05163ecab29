//! One request's grammar state: llguidance's matcher behind the serve
//! loop's [`Constraint`] trait.

use std::fmt;

use llguidance::Matcher;
use spec_core::{Constraint, SpecError, TokenMask};
use toktrie::SimpleVob;

/// A compiled grammar following one request's output
/// ([`crate::TokenEnv::constraint`]).
///
/// End-of-sequence ids are never ordinary tokens here: masks leave them out
/// and set [`TokenMask::end_allowed`] where the grammar may end, `validate`
/// stops at one, and `commit` or `masks` refuse one. A refused token is an
/// error that leaves the state unchanged.
pub struct GrammarConstraint {
    matcher: Matcher,
    eos_ids: Vec<u32>,
    vocab_size: usize,
}

impl fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarConstraint")
            .field("vocab_size", &self.vocab_size)
            .field("complete", &self.is_complete())
            .field("error", &self.matcher.get_error())
            .finish_non_exhaustive()
    }
}

fn llg_error(what: &str, err: impl fmt::Display) -> SpecError {
    SpecError::Constraint(format!("{what}: {err}"))
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher, eos_ids: Vec<u32>, vocab_size: usize) -> Self {
        Self {
            matcher,
            eos_ids,
            vocab_size,
        }
    }

    /// Whether `id` can be an ordinary token at all: inside the vocabulary
    /// and not an end-of-sequence id.
    fn ordinary(&self, id: u32) -> bool {
        (id as usize) < self.vocab_size && !self.eos_ids.contains(&id)
    }

    /// Errors if the matcher failed earlier (it refuses everything since).
    fn check(&self) -> Result<(), SpecError> {
        match self.matcher.get_error() {
            Some(e) => Err(llg_error("grammar", e)),
            None => Ok(()),
        }
    }

    /// How many leading `tokens` the grammar allows from the current state.
    fn count_allowed(&mut self, tokens: &[u32]) -> Result<usize, SpecError> {
        self.check()?;
        let ordinary = tokens
            .iter()
            .position(|&t| !self.ordinary(t))
            .unwrap_or(tokens.len());
        if ordinary == 0 || self.matcher.is_stopped() {
            return Ok(0);
        }
        self.matcher
            .validate_tokens(&tokens[..ordinary])
            .map_err(|e| llg_error("validating tokens", e))
    }

    /// Errors unless every token of `tokens` is allowed in turn.
    fn require_allowed(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        let n = self.count_allowed(tokens)?;
        match tokens.get(n) {
            None => Ok(()),
            Some(t) => Err(SpecError::Constraint(format!(
                "token {t} (position {n}) is refused by the grammar"
            ))),
        }
    }

    /// llguidance's raw mask for the current state (EOS bits as it set
    /// them), or `None` once the matcher has stopped (only the end follows).
    fn raw_mask(&mut self) -> Result<Option<SimpleVob>, SpecError> {
        self.check()?;
        if self.matcher.is_stopped() {
            return Ok(None);
        }
        self.matcher
            .compute_mask()
            .map(Some)
            .map_err(|e| llg_error("computing the mask", e))
    }

    /// The mask of the current state, EOS ids cleared into `end_allowed`.
    fn to_mask(&self, raw: Option<SimpleVob>) -> TokenMask {
        let Some(mut vob) = raw else {
            return TokenMask::from_words(Vec::new(), self.vocab_size, true);
        };
        let mut end_allowed = false;
        for &eos in &self.eos_ids {
            if vob.is_allowed(eos) {
                end_allowed = true;
                vob.disallow_token(eos);
            }
        }
        TokenMask::from_words(vob.into(), self.vocab_size, end_allowed)
    }

    /// Consumes one token, known to be allowed.
    fn consume(&mut self, token: u32) -> Result<(), SpecError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| llg_error("consuming a token", e))
    }

    /// Rolls back `n` consumed tokens.
    fn rollback(&mut self, n: usize) -> Result<(), SpecError> {
        self.matcher
            .rollback(n)
            .map_err(|e| llg_error("rolling back", e))
    }
}

impl Constraint for GrammarConstraint {
    fn validate(&mut self, tokens: &[u32]) -> Result<usize, SpecError> {
        self.count_allowed(tokens)
    }

    fn forced(&mut self, prefix: &[u32], max: usize) -> Result<Vec<u32>, SpecError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.require_allowed(prefix)?;
        self.matcher
            .consume_tokens(prefix)
            .map_err(|e| llg_error("consuming the prefix", e))?;
        let mut forced = if self.matcher.is_stopped() {
            Vec::new()
        } else {
            self.matcher.compute_ff_tokens()
        };
        if let Some(e) = self.matcher.get_error() {
            return Err(llg_error("computing forced tokens", e));
        }
        self.rollback(prefix.len())?;
        if let Some(cut) = forced.iter().position(|&t| !self.ordinary(t)) {
            forced.truncate(cut);
        }
        forced.truncate(max);
        Ok(forced)
    }

    fn masks(&mut self, tokens: &[u32]) -> Result<Vec<TokenMask>, SpecError> {
        let mut masks = Vec::with_capacity(tokens.len() + 1);
        let mut consumed = 0;
        let result = (|| {
            for &token in tokens {
                let raw = self.raw_mask()?;
                // The mask answers for this token cheaply; llguidance's
                // mask holds only the canonical token where bytes are
                // forced, so a token outside it is validated before use.
                let allowed = self.ordinary(token)
                    && match &raw {
                        Some(vob) if vob.is_allowed(token) => true,
                        _ => self.count_allowed(&[token])? == 1,
                    };
                masks.push(self.to_mask(raw));
                if !allowed {
                    return Err(SpecError::Constraint(format!(
                        "token {token} (position {consumed}) is refused by the grammar"
                    )));
                }
                self.consume(token)?;
                consumed += 1;
            }
            let raw = self.raw_mask()?;
            masks.push(self.to_mask(raw));
            Ok(())
        })();
        let rolled_back = self.rollback(consumed);
        // A failure inside may have failed the matcher too: report it first.
        result?;
        rolled_back?;
        Ok(masks)
    }

    fn commit(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        self.require_allowed(tokens)?;
        self.matcher
            .consume_tokens(tokens)
            .map_err(|e| llg_error("committing tokens", e))
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}
