//! The prompt's own log-probabilities ([`crate::Request::prompt_logprobs`]):
//! each prompt token after the first under the target's distribution at
//! the position before it, from the prefill chunks' logits (the model's
//! own, in float32: no processor or constraint applies to a prompt), with
//! that position's most likely tokens.

use mlx_rs::{Array, Dtype};

use crate::{PromptLogprob, ServeError};

/// A request's prompt scores as its chunks run.
pub(super) struct PromptScores {
    /// Alternatives to keep per position.
    top: usize,
    /// `prompt[i + 1]`'s score, for each position `i` run so far.
    pub(super) scores: Vec<PromptLogprob>,
}

impl PromptScores {
    pub(super) fn new(top: usize) -> Self {
        Self {
            top,
            scores: Vec::new(),
        }
    }

    /// Scores a chunk: `logits` (`[1, L, V]`) of the positions whose next
    /// tokens are `next` (`L` of them, in order).
    pub(super) fn push_chunk(&mut self, logits: &Array, next: &[u32]) -> Result<(), ServeError> {
        let shape = logits.shape();
        let (rows, vocab) = match shape {
            [1, rows, vocab] if *rows as usize == next.len() => (*rows as usize, *vocab as usize),
            _ => {
                return Err(ServeError::Spec(spec_core::SpecError::Internal(
                    "prompt logits do not match the chunk",
                )))
            }
        };
        let lp = mlx_ext::softmax::log_softmax(&logits.as_dtype(Dtype::Float32)?)?;
        lp.eval()?;
        let values = lp.as_slice::<f32>();
        for (row, &token) in next.iter().enumerate().take(rows) {
            let row = &values[row * vocab..(row + 1) * vocab];
            let chosen = row.get(token as usize).copied().ok_or_else(|| {
                ServeError::Spec(spec_core::SpecError::Internal(
                    "a prompt token is outside the vocabulary",
                ))
            })?;
            self.scores.push(PromptLogprob {
                logprob: chosen,
                top: super::top_of(row, self.top),
            });
        }
        Ok(())
    }

    /// Forgets every score (the prefill starts over).
    pub(super) fn clear(&mut self) {
        self.scores.clear();
    }
}
