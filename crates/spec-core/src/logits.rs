//! Logits processors: transformations applied to the logits of every
//! position before sampling: logit bias and mlx-lm's three penalties
//! (repetition, presence, frequency), built in mlx-lm's order by
//! [`Penalties::processors`].

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::select;
use mlx_rs::Array;

use crate::{InputError, SpecError};

/// Rewrites logits `[1, V]` given the tokens so far (prompt and generated).
pub trait LogitsProcessor {
    /// Returns the processed logits.
    fn process(&mut self, history: &[u32], logits: &Array) -> Result<Array, SpecError>;
}

/// The tokens a penalty looks at: mlx-lm's `tokens[-context:]`, in which
/// a context of 0 is the whole history (Python's `[-0:]`).
fn recent(history: &[u32], context: usize) -> &[u32] {
    if context == 0 {
        history
    } else {
        &history[history.len().saturating_sub(context)..]
    }
}

/// `value` as a scalar of the logits' dtype: mlx-lm's Python floats are
/// weakly typed, so `logits * 1.3` runs in the logits' own dtype.
fn scalar(value: f32, logits: &Array) -> Result<Array, SpecError> {
    Ok(Array::from_f32(value).as_dtype(logits.dtype())?)
}

/// A penalty's `(amount, context)` checked: a finite amount, non-negative
/// where `non_negative`.
fn checked(name: &'static str, penalty: f32, non_negative: bool) -> Result<f32, SpecError> {
    if !penalty.is_finite() || (non_negative && penalty < 0.0) {
        let expected = if non_negative {
            "a finite number >= 0"
        } else {
            "a finite number"
        };
        return Err(InputError::SamplerParam {
            name,
            value: penalty,
            expected: expected.into(),
        }
        .into());
    }
    Ok(penalty)
}

/// mlx-lm's repetition penalty: logits of the last `context` tokens are
/// divided by `penalty` when positive and multiplied when negative.
#[derive(Debug, Clone)]
pub struct RepetitionPenalty {
    penalty: f32,
    context: usize,
}

impl RepetitionPenalty {
    /// A penalty over the last `context` tokens (mlx-lm's default is 20;
    /// 0 is the whole history).
    pub fn new(penalty: f32, context: usize) -> Result<Self, SpecError> {
        let penalty = checked("repetition_penalty", penalty, true)?;
        Ok(Self { penalty, context })
    }
}

impl LogitsProcessor for RepetitionPenalty {
    fn process(&mut self, history: &[u32], logits: &Array) -> Result<Array, SpecError> {
        let recent = recent(history, self.context);
        if recent.is_empty() {
            return Ok(logits.clone());
        }
        let ids = Array::from_slice(recent, &[recent.len() as i32]);
        let selected = logits.index((.., &ids));
        let penalty = scalar(self.penalty, logits)?;
        let penalised = select(
            &selected.lt(scalar(0.0, logits)?)?,
            selected.multiply(&penalty)?,
            selected.divide(&penalty)?,
        )?;
        let mut out = logits.clone();
        out.try_index_mut((.., &ids), &penalised)?;
        Ok(out)
    }
}

/// OpenAI's and mlx-lm's presence penalty: `penalty` is taken once from
/// the logit of every token among the last `context` (0: all).
#[derive(Debug, Clone)]
pub struct PresencePenalty {
    penalty: f32,
    context: usize,
}

impl PresencePenalty {
    /// Any finite amount (negative rewards repeats).
    pub fn new(penalty: f32, context: usize) -> Result<Self, SpecError> {
        let penalty = checked("presence_penalty", penalty, false)?;
        Ok(Self { penalty, context })
    }
}

impl LogitsProcessor for PresencePenalty {
    fn process(&mut self, history: &[u32], logits: &Array) -> Result<Array, SpecError> {
        let recent = recent(history, self.context);
        if recent.is_empty() {
            return Ok(logits.clone());
        }
        // A token seen twice is written twice with the same value: once.
        let ids = Array::from_slice(recent, &[recent.len() as i32]);
        let lowered = logits
            .index((.., &ids))
            .subtract(scalar(self.penalty, logits)?)?;
        let mut out = logits.clone();
        out.try_index_mut((.., &ids), &lowered)?;
        Ok(out)
    }
}

/// OpenAI's and mlx-lm's frequency penalty: `penalty` is taken from a
/// token's logit once for each time it occurs among the last `context`
/// (0: all), one subtraction after the other as mlx-lm's scatter-add does
/// them (so the bits are its bits).
#[derive(Debug, Clone)]
pub struct FrequencyPenalty {
    penalty: f32,
    context: usize,
}

impl FrequencyPenalty {
    /// Any finite amount (negative rewards repeats).
    pub fn new(penalty: f32, context: usize) -> Result<Self, SpecError> {
        let penalty = checked("frequency_penalty", penalty, false)?;
        Ok(Self { penalty, context })
    }
}

impl LogitsProcessor for FrequencyPenalty {
    fn process(&mut self, history: &[u32], logits: &Array) -> Result<Array, SpecError> {
        let mut counts = std::collections::BTreeMap::<u32, usize>::new();
        for &t in recent(history, self.context) {
            *counts.entry(t).or_default() += 1;
        }
        let penalty = scalar(self.penalty, logits)?;
        let mut out = logits.clone();
        // Round k lowers every token seen at least k times once more.
        let mut round = 1;
        loop {
            let ids: Vec<u32> = counts
                .iter()
                .filter(|&(_, &c)| c >= round)
                .map(|(&t, _)| t)
                .collect();
            if ids.is_empty() {
                return Ok(out);
            }
            let ids = Array::from_slice(&ids, &[ids.len() as i32]);
            let lowered = out.index((.., &ids)).subtract(&penalty)?;
            out.try_index_mut((.., &ids), &lowered)?;
            round += 1;
        }
    }
}

/// mlx-lm's penalties of a request (`make_logits_processors`): each an
/// amount and the tokens it looks back over (0: the whole history).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Divides (multiplies, if negative) the logits of recent tokens; 0 or
    /// `None` is off. mlx-lm's `repetition_penalty`, `repetition_context_size`.
    pub repetition: Option<(f32, usize)>,
    /// Subtracted once from each recent token's logit; 0 or `None` is off.
    pub presence: Option<(f32, usize)>,
    /// Subtracted from a recent token's logit per occurrence; 0 or `None`
    /// is off.
    pub frequency: Option<(f32, usize)>,
}

/// mlx-lm's default look-back of each penalty.
pub const DEFAULT_PENALTY_CONTEXT: usize = 20;

impl Penalties {
    /// The processors of `bias` and these penalties in mlx-lm's order
    /// (bias, repetition, presence, frequency); a penalty of 0 is left out
    /// as mlx-lm leaves it out.
    pub fn processors(
        &self,
        bias: Option<LogitBias>,
    ) -> Result<Vec<Box<dyn LogitsProcessor + Send>>, SpecError> {
        let mut out: Vec<Box<dyn LogitsProcessor + Send>> = Vec::new();
        if let Some(bias) = bias.filter(|b| !b.is_empty()) {
            out.push(Box::new(bias));
        }
        let on = |p: Option<(f32, usize)>| p.filter(|&(amount, _)| amount != 0.0);
        if let Some((p, c)) = on(self.repetition) {
            out.push(Box::new(RepetitionPenalty::new(p, c)?));
        }
        if let Some((p, c)) = on(self.presence) {
            out.push(Box::new(PresencePenalty::new(p, c)?));
        }
        if let Some((p, c)) = on(self.frequency) {
            out.push(Box::new(FrequencyPenalty::new(p, c)?));
        }
        Ok(out)
    }

    /// Whether any penalty is on.
    pub fn any(&self) -> bool {
        [self.repetition, self.presence, self.frequency]
            .iter()
            .any(|p| p.is_some_and(|(amount, _)| amount != 0.0))
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
        // Context 0: the whole history, as mlx-lm's `tokens[-0:]`.
        let mut all = RepetitionPenalty::new(2.0, 0).expect("penalty");
        let out = all.process(&[2, 0, 1], &logits).expect("process");
        assert_eq!(out.as_slice::<f32>(), &[1.0, -4.0, 2.0, 1.0]);
    }

    #[test]
    fn presence_counts_a_token_once_and_frequency_per_occurrence() {
        let logits = Array::from_slice(&[2.0f32, -2.0, 4.0, 1.0], &[1, 4]);
        let history = [3, 0, 0, 0, 2];
        let mut presence = PresencePenalty::new(0.5, 4).expect("presence");
        assert_eq!(
            presence
                .process(&history, &logits)
                .expect("process")
                .as_slice::<f32>(),
            &[1.5, -2.0, 3.5, 1.0],
            "3 is outside the last 4; 0 seen three times is lowered once"
        );
        let mut frequency = FrequencyPenalty::new(0.5, 4).expect("frequency");
        assert_eq!(
            frequency
                .process(&history, &logits)
                .expect("process")
                .as_slice::<f32>(),
            &[0.5, -2.0, 3.5, 1.0]
        );
        // Negative amounts reward repeats; nothing seen, nothing changes.
        let mut reward = FrequencyPenalty::new(-1.0, 0).expect("reward");
        assert_eq!(
            reward
                .process(&history, &logits)
                .expect("process")
                .as_slice::<f32>(),
            &[5.0, -2.0, 5.0, 2.0]
        );
        assert_eq!(
            reward
                .process(&[], &logits)
                .expect("process")
                .as_slice::<f32>(),
            logits.as_slice::<f32>()
        );
        assert!(PresencePenalty::new(f32::INFINITY, 20).is_err());
        assert!(FrequencyPenalty::new(f32::NAN, 20).is_err());
    }

    #[test]
    fn repeated_subtractions_round_each_time_as_a_scatter_add_does() {
        // 1 - 0.1 - 0.1 - 0.1 in float32 is 0.69999993, not 1 - 0.3.
        let logits = Array::from_slice(&[1.0f32, 0.0], &[1, 2]);
        let mut frequency = FrequencyPenalty::new(0.1, 20).expect("frequency");
        let out = frequency.process(&[0, 0, 0], &logits).expect("process");
        let want = ((1.0f32 - 0.1) - 0.1) - 0.1;
        assert_eq!(out.as_slice::<f32>()[0].to_bits(), want.to_bits());
        // In bfloat16 logits the amount is a bfloat16 too (a weak scalar).
        let half = logits.as_dtype(mlx_rs::Dtype::Bfloat16).expect("bf16");
        let out = frequency.process(&[0], &half).expect("process bf16");
        assert_eq!(out.dtype(), mlx_rs::Dtype::Bfloat16);
    }

    #[test]
    fn penalties_build_in_mlx_lm_order_and_leave_zero_out() {
        let none = Penalties {
            repetition: Some((0.0, 20)),
            presence: None,
            frequency: Some((0.0, 5)),
        };
        assert!(!none.any());
        assert!(none.processors(None).expect("build").is_empty());
        let all = Penalties {
            repetition: Some((1.5, 20)),
            presence: Some((0.5, 20)),
            frequency: Some((0.25, 20)),
        };
        assert!(all.any());
        let bias = LogitBias::new(&[(1, 3.0)], 4).expect("bias");
        let mut chain = all.processors(Some(bias)).expect("build");
        assert_eq!(chain.len(), 4);
        // Applied in order: +3 on 1, then /1.5, -0.5, -0.25 on 1 and 2.
        let logits = Array::from_slice(&[2.0f32, 3.0, 3.0, 1.0], &[1, 4]);
        let mut x = logits;
        for p in chain.iter_mut() {
            x = p.process(&[1, 2], &x).expect("process");
        }
        let got = x.as_slice::<f32>();
        let want1 = (((3.0f32 + 3.0) / 1.5) - 0.5) - 0.25;
        let want2 = ((3.0f32 / 1.5) - 0.5) - 0.25;
        assert_eq!(got, &[2.0, want1, want2, 1.0]);
        let bad = Penalties {
            repetition: Some((-1.0, 20)),
            ..none
        };
        assert!(bad.processors(None).is_err());
    }
}
