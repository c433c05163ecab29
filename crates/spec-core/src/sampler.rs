//! Token samplers: `logprobs [1, V] -> token [1]`, one per request,
//! shared by drafting and verification. The stochastic sampler applies
//! mlx-lm's filters in mlx-lm's order (top-p, min-p, top-k), then samples
//! `categorical(logprobs / temperature)` from a seeded key sequence.

use mlx_rs::ops::indexing::{argmax_axis, put_along_axis, IndexOp};
use mlx_rs::ops::{argpartition_axis, cumsum, select, sort_axis};
use mlx_rs::{random, Array};

use crate::{InputError, SpecError};

/// Picks the next token from log-probabilities.
pub trait Sampler {
    /// `logprobs` is `[1, V]`; returns the chosen token ids, `[1]` (uint32).
    fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError>;
    /// Whether this sampler is the argmax (exact-match verification applies).
    fn is_greedy(&self) -> bool;
    /// The distribution `sample` draws from, as probabilities `[1, V]`
    /// (a point mass on the argmax for the greedy sampler): what lossless
    /// rejection sampling must preserve.
    fn probabilities(&self, logprobs: &Array) -> Result<Array, SpecError>;
}

/// Sampling parameters, named as mlx-lm names them.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus threshold in (0, 1); 0 or 1 disables it.
    pub top_p: f32,
    /// Keep tokens with p >= min_p * p_max; 0 disables it.
    pub min_p: f32,
    /// Keep the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Seed of the key sequence (reproducible sampled runs).
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Checks the ranges; `vocab_size` bounds top-k.
    pub fn validate(&self, vocab_size: usize) -> Result<(), SpecError> {
        let bad = |name, value: f32, expected: String| {
            Err(InputError::SamplerParam {
                name,
                value,
                expected,
            }
            .into())
        };
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", self.temperature, "finite and >= 0".into());
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top_p", self.top_p, "in [0, 1]".into());
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "in [0, 1]".into());
        }
        if self.top_k >= vocab_size && self.top_k != 0 {
            return bad(
                "top_k",
                self.top_k as f32,
                format!("below the vocabulary size {vocab_size}"),
            );
        }
        Ok(())
    }

    /// The sampler these parameters describe.
    pub fn build(&self, vocab_size: usize) -> Result<Box<dyn Sampler>, SpecError> {
        self.validate(vocab_size)?;
        if self.temperature == 0.0 {
            Ok(Box::new(GreedySampler))
        } else {
            Ok(Box::new(StochasticSampler::new(self.clone())?))
        }
    }
}

/// The argmax.
#[derive(Debug, Clone, Copy, Default)]
pub struct GreedySampler;

impl Sampler for GreedySampler {
    fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError> {
        Ok(argmax_axis(logprobs, -1, None)?)
    }
    fn is_greedy(&self) -> bool {
        true
    }
    fn probabilities(&self, logprobs: &Array) -> Result<Array, SpecError> {
        let vocab = logprobs.shape().last().copied().unwrap_or(0);
        let best = argmax_axis(logprobs, -1, true)?;
        let ids = mlx_rs::ops::arange::<_, u32>(0, vocab, None)?;
        Ok(ids.eq(&best)?.as_dtype(mlx_rs::Dtype::Float32)?)
    }
}

/// Temperature sampling with top-p, min-p and top-k filters.
#[derive(Debug)]
pub struct StochasticSampler {
    config: SamplerConfig,
    key: Array,
}

impl StochasticSampler {
    /// A sampler whose key sequence starts from `config.seed`.
    pub fn new(config: SamplerConfig) -> Result<Self, SpecError> {
        let key = random::key(config.seed)?;
        Ok(Self { config, key })
    }

    fn next_key(&mut self) -> Result<Array, SpecError> {
        let (next, sub) = random::split(&self.key, 2)?;
        self.key = next;
        Ok(sub)
    }
}

fn neg_inf() -> Array {
    Array::from_f32(f32::NEG_INFINITY)
}

/// mlx-lm's nucleus filter: drop the least likely tokens whose mass above
/// them already reaches `top_p`.
fn apply_top_p(logprobs: &Array, top_p: f32) -> Result<Array, SpecError> {
    let sorted = sort_axis(logprobs, -1)?;
    let probs = sorted.as_type::<f32>()?.exp()?;
    let above = cumsum(&probs, -1, true, false)?;
    let total = above.index((.., 0..1)).add(probs.index((.., 0..1)))?;
    let dropped = above
        .ge(total.multiply(Array::from_f32(top_p))?)?
        .sum_axis(-1, true)?;
    let threshold = sorted.take_along_axis(dropped.as_type::<u32>()?, -1)?;
    Ok(select(&logprobs.lt(&threshold)?, neg_inf(), logprobs)?)
}

fn apply_min_p(logprobs: &Array, min_p: f32) -> Result<Array, SpecError> {
    let top = logprobs.max_axis(-1, true)?;
    let floor = top.add(Array::from_f32(min_p.ln()))?;
    Ok(select(&logprobs.lt(&floor)?, neg_inf(), logprobs)?)
}

fn apply_top_k(logprobs: &Array, k: usize) -> Result<Array, SpecError> {
    let k = i32::try_from(k).map_err(|_| InputError::TooLarge {
        what: "top_k",
        value: k,
    })?;
    let order = argpartition_axis(&logprobs.negative()?, k - 1, -1)?;
    let masked = order.index((.., k..));
    Ok(put_along_axis(logprobs, &masked, neg_inf(), -1)?)
}

impl StochasticSampler {
    /// The filtered log-probabilities scaled by 1 / temperature: the logits
    /// `categorical` draws from.
    fn scaled(&self, logprobs: &Array) -> Result<Array, SpecError> {
        let mut x = logprobs.clone();
        if 0.0 < self.config.top_p && self.config.top_p < 1.0 {
            x = apply_top_p(&x, self.config.top_p)?;
        }
        if self.config.min_p != 0.0 {
            x = apply_min_p(&x, self.config.min_p)?;
        }
        if self.config.top_k > 0 {
            x = apply_top_k(&x, self.config.top_k)?;
        }
        Ok(x.multiply(Array::from_f32(1.0 / self.config.temperature))?)
    }
}

impl Sampler for StochasticSampler {
    fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError> {
        let scaled = self.scaled(logprobs)?;
        let key = self.next_key()?;
        Ok(random::categorical(&scaled, -1, None, &key)?)
    }
    fn is_greedy(&self) -> bool {
        false
    }
    fn probabilities(&self, logprobs: &Array) -> Result<Array, SpecError> {
        Ok(mlx_rs::ops::softmax_axis(
            &self.scaled(logprobs)?,
            -1,
            true,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logprobs(p: &[f32]) -> Array {
        let lp: Vec<f32> = p.iter().map(|v| v.ln()).collect();
        Array::from_slice(&lp, &[1, p.len() as i32])
    }

    fn kept(x: &Array) -> Vec<bool> {
        x.as_slice::<f32>().iter().map(|v| v.is_finite()).collect()
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let t = GreedySampler
            .sample(&logprobs(&[0.1, 0.6, 0.3]))
            .expect("sample");
        assert_eq!(t.as_slice::<u32>(), &[1]);
    }

    #[test]
    fn filters_keep_what_mlx_lm_keeps() {
        let x = logprobs(&[0.05, 0.5, 0.3, 0.15]);
        // top-p 0.8: 0.5 + 0.3 reach it; the rest go.
        assert_eq!(
            kept(&apply_top_p(&x, 0.8).expect("top_p")),
            [false, true, true, false]
        );
        // min-p 0.5: keep p >= 0.25.
        assert_eq!(
            kept(&apply_min_p(&x, 0.5).expect("min_p")),
            [false, true, true, false]
        );
        // top-k 3.
        assert_eq!(
            kept(&apply_top_k(&x, 3).expect("top_k")),
            [false, true, true, true]
        );
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let config = SamplerConfig {
            temperature: 1.0,
            seed: 7,
            ..SamplerConfig::default()
        };
        let p = [0.1f32, 0.2, 0.7];
        let x = logprobs(&p);
        let draw = |config: &SamplerConfig| -> Vec<u32> {
            let mut s = StochasticSampler::new(config.clone()).expect("sampler");
            (0..3000)
                .map(|_| s.sample(&x).expect("sample").as_slice::<u32>()[0])
                .collect()
        };
        let a = draw(&config);
        assert_eq!(a, draw(&config), "same seed, same samples");
        assert_ne!(
            a,
            draw(&SamplerConfig {
                seed: 8,
                ..config.clone()
            }),
            "another seed, other samples"
        );
        for (token, &want) in p.iter().enumerate() {
            let freq = a.iter().filter(|&&t| t as usize == token).count() as f32 / a.len() as f32;
            assert!(
                (freq - want).abs() < 0.03,
                "token {token}: {freq} vs {want}"
            );
        }
    }

    #[test]
    fn probabilities_are_what_sampling_draws_from() {
        let x = logprobs(&[0.05, 0.5, 0.3, 0.15]);
        let greedy = GreedySampler.probabilities(&x).expect("greedy");
        assert_eq!(greedy.as_slice::<f32>(), &[0.0, 1.0, 0.0, 0.0]);
        let config = SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            ..SamplerConfig::default()
        };
        let s = StochasticSampler::new(config).expect("sampler");
        let p = s.probabilities(&x).expect("probabilities");
        let p = p.as_slice::<f32>();
        assert!(
            (p[1] - 0.5 / 0.8).abs() < 1e-6
                && (p[2] - 0.3 / 0.8).abs() < 1e-6
                && p[0] == 0.0
                && p[3] == 0.0,
            "{p:?}"
        );
    }

    #[test]
    fn bad_parameters_are_rejected() {
        for bad in [
            SamplerConfig {
                temperature: -1.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                top_p: 1.5,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                min_p: -0.1,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                top_k: 10,
                ..SamplerConfig::default()
            },
        ] {
            assert!(
                matches!(
                    bad.build(10),
                    Err(SpecError::Input(InputError::SamplerParam { .. }))
                ),
                "{bad:?}"
            );
        }
    }
}
