//! Logits processors: transformations applied to the logits of every
//! position before sampling (repetition penalty; later, grammar masks).

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::select;
use mlx_rs::Array;

use crate::{InputError, SpecError};

/// Rewrites logits `[1, V]` given the tokens so far (prompt and generated).
pub trait LogitsProcessor {
    /// Returns the processed logits.
    fn process(&mut self, history: &[u32], logits: &Array) -> Result<Array, SpecError>;
}

/// mlx-lm's repetition penalty: logits of the last `context` tokens are
/// divided by `penalty` when positive and multiplied when negative.
#[derive(Debug, Clone)]
pub struct RepetitionPenalty {
    penalty: f32,
    context: usize,
}

impl RepetitionPenalty {
    /// A penalty over the last `context` tokens (mlx-lm's default is 20).
    pub fn new(penalty: f32, context: usize) -> Result<Self, SpecError> {
        if !penalty.is_finite() || penalty < 0.0 {
            return Err(InputError::SamplerParam {
                name: "repetition_penalty",
                value: penalty,
                expected: "a non-negative number".into(),
            }
            .into());
        }
        Ok(Self { penalty, context })
    }
}

impl LogitsProcessor for RepetitionPenalty {
    fn process(&mut self, history: &[u32], logits: &Array) -> Result<Array, SpecError> {
        if history.is_empty() {
            return Ok(logits.clone());
        }
        let recent = &history[history.len().saturating_sub(self.context)..];
        let ids = Array::from_slice(recent, &[recent.len() as i32]);
        let selected = logits.index((.., &ids));
        let penalised = select(
            &selected.lt(Array::from_f32(0.0))?,
            selected.multiply(Array::from_f32(self.penalty))?,
            selected.divide(Array::from_f32(self.penalty))?,
        )?;
        let mut out = logits.clone();
        out.try_index_mut((.., &ids), &penalised)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalty_shrinks_recent_tokens_only() {
        let logits = Array::from_slice(&[2.0f32, -2.0, 4.0, 1.0], &[1, 4]);
        let mut p = RepetitionPenalty::new(2.0, 2).expect("penalty");
        let out = p.process(&[2, 0, 1], &logits).expect("process");
        // Only the last two tokens (0 and 1) count: 2 -> 1, -2 -> -4.
        assert_eq!(out.as_slice::<f32>(), &[1.0, -4.0, 4.0, 1.0]);
        assert!(RepetitionPenalty::new(-1.0, 20).is_err());
    }
}
