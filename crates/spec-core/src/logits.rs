//! Logits processors: transformations applied to the logits of every
//! position before sampling (repetition penalty, logit bias).

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

/// The most a logit bias may add or take away (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// OpenAI's and mlx-lm's `logit_bias`: a fixed amount added to the logits
/// of chosen token ids before sampling (and before the log-probabilities
/// are taken, as mlx-lm does); -100 all but bans a token, +100 all but
/// forces it.
#[derive(Debug, Clone)]
pub struct LogitBias {
    ids: Vec<u32>,
    biases: Vec<f32>,
}

impl LogitBias {
    /// A bias per token id, each in `[-100, 100]`, ids below `vocab`.
    /// An id given twice adds its biases (mlx-lm's `.at[].add`).
    pub fn new(entries: &[(u32, f32)], vocab: usize) -> Result<Self, SpecError> {
        let mut merged: std::collections::BTreeMap<u32, f32> = std::collections::BTreeMap::new();
        for &(id, bias) in entries {
            if !bias.is_finite() || !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
                return Err(InputError::SamplerParam {
                    name: "logit_bias",
                    value: bias,
                    expected: format!("between -100 and 100 (token {id})"),
                }
                .into());
            }
            if id as usize >= vocab {
                return Err(InputError::SamplerParam {
                    name: "logit_bias",
                    value: id as f32,
                    expected: format!("a token id below the vocabulary's {vocab}"),
                }
                .into());
            }
            *merged.entry(id).or_insert(0.0) += bias;
        }
        let (ids, biases) = merged.into_iter().unzip();
        Ok(Self { ids, biases })
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

impl LogitsProcessor for LogitBias {
    fn process(&mut self, _history: &[u32], logits: &Array) -> Result<Array, SpecError> {
        if self.ids.is_empty() {
            return Ok(logits.clone());
        }
        let width = logits.shape().last().copied().unwrap_or(0).max(0) as usize;
        if let Some(&id) = self.ids.iter().find(|&&id| id as usize >= width) {
            return Err(InputError::SamplerParam {
                name: "logit_bias",
                value: id as f32,
                expected: format!("a token id below the logits' width {width}"),
            }
            .into());
        }
        let ids = Array::from_slice(&self.ids, &[self.ids.len() as i32]);
        let biases = Array::from_slice(&self.biases, &[self.biases.len() as i32])
            .as_dtype(logits.dtype())?;
        let biased = logits.index((.., &ids)).add(&biases)?;
        let mut out = logits.clone();
        out.try_index_mut((.., &ids), &biased)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_adds_to_the_named_tokens_only() {
        let logits = Array::from_slice(&[2.0f32, -2.0, 4.0, 1.0], &[1, 4]);
        let mut bias = LogitBias::new(&[(1, 100.0), (3, -0.5), (3, -0.5)], 4).expect("bias");
        let out = bias.process(&[0, 1], &logits).expect("process");
        assert_eq!(
            out.as_slice::<f32>(),
            &[2.0, 98.0, 4.0, 0.0],
            "3 given twice adds twice"
        );
        // The same in bfloat16 logits: the dtype is kept.
        let half = logits.as_dtype(mlx_rs::Dtype::Bfloat16).expect("bf16");
        let out = bias.process(&[], &half).expect("process bf16");
        assert_eq!(out.dtype(), mlx_rs::Dtype::Bfloat16);
        assert!(LogitBias::new(&[(0, 100.5)], 4).is_err(), "past +100");
        assert!(LogitBias::new(&[(0, -101.0)], 4).is_err(), "past -100");
        assert!(LogitBias::new(&[(0, f32::NAN)], 4).is_err());
        assert!(
            LogitBias::new(&[(4, 1.0)], 4).is_err(),
            "past the vocabulary"
        );
        assert!(LogitBias::new(&[], 4).expect("empty").is_empty());
        // Logits narrower than an id (another model's): an error, not a bad read.
        let mut wide = LogitBias::new(&[(9, 1.0)], 16).expect("bias");
        assert!(wide.process(&[], &logits).is_err());
    }

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
