//! Token samplers: `logprobs [1, V] -> token [1]`, one per request,
//! shared by drafting and verification. The stochastic sampler applies
//! mlx-lm's filters in mlx-lm's order (top-p, min-p, XTC, top-k), then
//! samples `categorical(logprobs / temperature)` from a seeded key
//! sequence.

use mlx_rs::ops::indexing::{argmax_axis, put_along_axis, IndexOp, TryIndexMutOp};
use mlx_rs::ops::{argpartition_axis, cumsum, select, softmax_axis, sort_axis};
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
    /// Tokens min-p never removes (the most likely ones); at least 1.
    pub min_tokens_to_keep: usize,
    /// XTC ("exclude top choices"): the chance, per token, that every token
    /// above `xtc_threshold` but the least likely of them is removed; 0
    /// disables it.
    pub xtc_probability: f32,
    /// XTC's probability threshold, in [0, 0.5].
    pub xtc_threshold: f32,
    /// Tokens XTC never removes (mlx-lm's hosts pass the encoding of
    /// `"\n"` and the end-of-sequence ids).
    pub xtc_special_tokens: Vec<u32>,
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
            min_tokens_to_keep: 1,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            xtc_special_tokens: Vec::new(),
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
        if self.min_tokens_to_keep == 0 || self.min_tokens_to_keep > vocab_size {
            return bad(
                "min_tokens_to_keep",
                self.min_tokens_to_keep as f32,
                format!("from 1 to the vocabulary size {vocab_size}"),
            );
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return bad("xtc_probability", self.xtc_probability, "in [0, 1]".into());
        }
        if !(0.0..=0.5).contains(&self.xtc_threshold) {
            return bad("xtc_threshold", self.xtc_threshold, "in [0, 0.5]".into());
        }
        if let Some(&id) = self
            .xtc_special_tokens
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return bad(
                "xtc_special_tokens",
                id as f32,
                format!("token ids below the vocabulary size {vocab_size}"),
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

/// Temperature sampling with top-p, min-p, XTC and top-k filters.
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

/// mlx-lm's min-p: drop tokens below `min_p` times the top probability,
/// but never the `keep` most likely. The logarithm is taken in double
/// precision, as Python's `math.log` takes it.
fn apply_min_p(logprobs: &Array, min_p: f32, keep: usize) -> Result<Array, SpecError> {
    let top = logprobs.max_axis(-1, true)?;
    let floor = top.add(Array::from_f32(f64::from(min_p).ln() as f32))?;
    let mut remove = logprobs.lt(&floor)?;
    if keep > 1 {
        let keep = i32::try_from(keep).map_err(|_| InputError::TooLarge {
            what: "min_tokens_to_keep",
            value: keep,
        })?;
        let order = argpartition_axis(logprobs, -keep, -1)?;
        let most_likely = order.index((.., -keep..));
        remove = put_along_axis(&remove, &most_likely, Array::from_bool(false), -1)?;
    }
    Ok(select(&remove, neg_inf(), logprobs)?)
}

/// mlx-lm's XTC mask, applied: every token whose probability is above
/// `threshold` is removed but the least likely of them (so one above it
/// always stays), and never the `special` ones.
fn apply_xtc(logprobs: &Array, threshold: f32, special: &[u32]) -> Result<Array, SpecError> {
    let probs = softmax_axis(logprobs, -1, false)?;
    let least_above = select(
        &probs.gt(Array::from_f32(threshold))?,
        &probs,
        Array::from_f32(f32::INFINITY),
    )?
    .min_axis(-1, true)?;
    let mut mask = probs.gt(&least_above)?;
    if !special.is_empty() {
        let ids = Array::from_slice(special, &[special.len() as i32]);
        mask.try_index_mut((.., &ids), Array::from_bool(false))?;
    }
    Ok(select(&mask, neg_inf(), logprobs)?)
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

/// The logits `categorical` draws from: with XTC on, both of its branches.
struct Scaled {
    /// XTC not applied (every token when XTC is off).
    kept: Array,
    /// XTC applied (at the chance `xtc_probability`); `None` when XTC is
    /// off.
    excluded: Option<Array>,
}

impl StochasticSampler {
    /// The filtered log-probabilities scaled by 1 / temperature (computed
    /// in double precision, as Python's `1.0 / temp`): the logits
    /// `categorical` draws from, without and with XTC's cut.
    fn scaled(&self, logprobs: &Array) -> Result<Scaled, SpecError> {
        let c = &self.config;
        let mut x = logprobs.clone();
        if 0.0 < c.top_p && c.top_p < 1.0 {
            x = apply_top_p(&x, c.top_p)?;
        }
        if c.min_p != 0.0 {
            x = apply_min_p(&x, c.min_p, c.min_tokens_to_keep)?;
        }
        let inverse = Array::from_f32((1.0 / f64::from(c.temperature)) as f32);
        let finish = |mut x: Array| -> Result<Array, SpecError> {
            if c.top_k > 0 {
                x = apply_top_k(&x, c.top_k)?;
            }
            Ok(x.multiply(&inverse)?)
        };
        let excluded = if c.xtc_probability > 0.0 {
            let cut = apply_xtc(&x, c.xtc_threshold, &c.xtc_special_tokens)?;
            Some(finish(cut)?)
        } else {
            None
        };
        Ok(Scaled {
            kept: finish(x)?,
            excluded,
        })
    }
}

impl Sampler for StochasticSampler {
    fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError> {
        let scaled = self.scaled(logprobs)?;
        let mut key = self.next_key()?;
        let logits = match scaled.excluded {
            None => scaled.kept,
            Some(excluded) => {
                // mlx-lm keeps the top choices when a uniform draw is above
                // the chance.
                let (coin, rest) = random::split(&key, 2)?;
                key = rest;
                let draw = random::uniform::<_, f32>(0.0, 1.0, None, &coin)?;
                let chance = Array::from_f32(self.config.xtc_probability);
                select(&draw.gt(&chance)?, &scaled.kept, &excluded)?
            }
        };
        Ok(random::categorical(&logits, -1, None, &key)?)
    }
    fn is_greedy(&self) -> bool {
        false
    }
    /// With XTC on, the mixture of its two branches by its chance.
    fn probabilities(&self, logprobs: &Array) -> Result<Array, SpecError> {
        let scaled = self.scaled(logprobs)?;
        let chance = self.config.xtc_probability;
        match scaled.excluded {
            None => Ok(softmax_axis(&scaled.kept, -1, true)?),
            Some(excluded) if chance >= 1.0 => Ok(softmax_axis(&excluded, -1, true)?),
            Some(excluded) => {
                let kept = softmax_axis(&scaled.kept, -1, true)?;
                let excluded = softmax_axis(&excluded, -1, true)?;
                Ok(kept
                    .multiply(Array::from_f32(1.0 - chance))?
                    .add(excluded.multiply(Array::from_f32(chance))?)?)
            }
        }
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
            kept(&apply_min_p(&x, 0.5, 1).expect("min_p")),
            [false, true, true, false]
        );
        // min-p 0.5 keeping at least 3: 0.15 stays too.
        assert_eq!(
            kept(&apply_min_p(&x, 0.5, 3).expect("min_p keep 3")),
            [false, true, true, true]
        );
        // top-k 3.
        assert_eq!(
            kept(&apply_top_k(&x, 3).expect("top_k")),
            [false, true, true, true]
        );
    }

    #[test]
    fn xtc_removes_the_top_choices_but_the_least_likely_of_them() {
        let x = logprobs(&[0.05, 0.5, 0.3, 0.15]);
        // Above 0.1: 0.5, 0.3 and 0.15; all but 0.15 go.
        assert_eq!(
            kept(&apply_xtc(&x, 0.1, &[]).expect("xtc")),
            [true, false, false, true]
        );
        // A special token is never removed.
        assert_eq!(
            kept(&apply_xtc(&x, 0.1, &[1]).expect("xtc special")),
            [true, true, false, true]
        );
        // One token above the threshold (or none): nothing goes.
        assert_eq!(kept(&apply_xtc(&x, 0.4, &[]).expect("xtc one")), [true; 4]);
        assert_eq!(kept(&apply_xtc(&x, 0.5, &[]).expect("xtc none")), [true; 4]);
    }

    #[test]
    fn xtc_sampling_draws_from_the_mixture_probabilities_reports() {
        let x = logprobs(&[0.05, 0.5, 0.3, 0.15]);
        let config = SamplerConfig {
            temperature: 1.0,
            xtc_probability: 0.5,
            xtc_threshold: 0.1,
            seed: 3,
            ..SamplerConfig::default()
        };
        let mut s = StochasticSampler::new(config.clone()).expect("sampler");
        let p = s.probabilities(&x).expect("probabilities");
        let p = p.as_slice::<f32>().to_vec();
        // Half the time the plain distribution, half the time 0.05 and 0.15
        // renormalised (0.25 and 0.75).
        let want = [
            0.5 * 0.05 + 0.5 * 0.25,
            0.5 * 0.5,
            0.5 * 0.3,
            0.5 * 0.15 + 0.5 * 0.75,
        ];
        for (got, want) in p.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        let n = 4000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&x).expect("sample").as_slice::<u32>()[0] as usize] += 1;
        }
        for (token, &want) in want.iter().enumerate() {
            let freq = counts[token] as f32 / n as f32;
            assert!(
                (freq - want).abs() < 0.03,
                "token {token}: {freq} vs {want}"
            );
        }
        // Always applied: exactly the cut distribution.
        let always = StochasticSampler::new(SamplerConfig {
            xtc_probability: 1.0,
            ..config
        })
        .expect("sampler");
        let p = always.probabilities(&x).expect("probabilities");
        let p = p.as_slice::<f32>();
        assert!(
            p[1] == 0.0 && p[2] == 0.0 && (p[3] - 0.75).abs() < 1e-6,
            "{p:?}"
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
            SamplerConfig {
                min_tokens_to_keep: 0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                xtc_probability: 1.5,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                xtc_threshold: 0.6,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                xtc_special_tokens: vec![10],
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
