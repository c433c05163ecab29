//! `generate`'s sampling and penalty flags, named as `mlx_lm.generate`
//! names them (the penalties as mlx_lm.server's request fields), and the
//! tokens XTC spares, which both hosts take from the tokenizer as mlx-lm's
//! do.

use anyhow::{Context, Result};
use spec_core::{Penalties, SamplerConfig, DEFAULT_PENALTY_CONTEXT};
use spec_text::Tokenizer;

/// Sampling flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 0.0)]
    top_p: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Min-p threshold (0: off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Tokens min-p never removes (the most likely ones).
    #[arg(long, default_value_t = 1)]
    min_tokens_to_keep: usize,
    /// XTC: the chance, per token, that every token above --xtc-threshold
    /// but the least likely of them is removed (0: off). The newline's
    /// tokens and the end tokens are never removed.
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f32,
    /// XTC's probability threshold, in [0, 0.5].
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f32,
    /// Seed of the sampler; without it each run samples afresh, as
    /// mlx-lm's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Repetition penalty: recent tokens' logits divided by it (multiplied
    /// when negative); 0 or unset: off.
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Tokens the repetition penalty looks back over (0: all of them).
    #[arg(long, default_value_t = DEFAULT_PENALTY_CONTEXT)]
    repetition_context_size: usize,
    /// Presence penalty: taken once from the logit of each recent token.
    #[arg(long, allow_hyphen_values = true)]
    presence_penalty: Option<f32>,
    /// Tokens the presence penalty looks back over (0: all of them).
    #[arg(long, default_value_t = DEFAULT_PENALTY_CONTEXT)]
    presence_context_size: usize,
    /// Frequency penalty: taken from a recent token's logit once per
    /// occurrence.
    #[arg(long, allow_hyphen_values = true)]
    frequency_penalty: Option<f32>,
    /// Tokens the frequency penalty looks back over (0: all of them).
    #[arg(long, default_value_t = DEFAULT_PENALTY_CONTEXT)]
    frequency_context_size: usize,
}

impl SamplingArgs {
    /// The sampler these flags describe (XTC sparing `tokenizer`'s newline
    /// and end tokens; a fresh seed where `--seed` names none).
    pub fn sampler(&self, tokenizer: &Tokenizer) -> Result<SamplerConfig> {
        let xtc_special_tokens = if self.xtc_probability > 0.0 {
            xtc_special_tokens(tokenizer)?
        } else {
            Vec::new()
        };
        Ok(SamplerConfig {
            temperature: self.temp,
            top_p: self.top_p,
            min_p: self.min_p,
            top_k: self.top_k,
            min_tokens_to_keep: self.min_tokens_to_keep,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            xtc_special_tokens,
            seed: crate::random::seed_or_fresh(self.seed),
        })
    }

    /// The penalties these flags turn on.
    pub fn penalties(&self) -> Penalties {
        Penalties {
            repetition: self
                .repetition_penalty
                .map(|p| (p, self.repetition_context_size)),
            presence: self
                .presence_penalty
                .map(|p| (p, self.presence_context_size)),
            frequency: self
                .frequency_penalty
                .map(|p| (p, self.frequency_context_size)),
        }
    }
}

/// The tokens XTC never removes, as mlx-lm's hosts choose them: the
/// tokenizer's encoding of a newline (with what it adds around a sequence)
/// and its end-of-sequence ids.
pub fn xtc_special_tokens(tokenizer: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids = tokenizer
        .encode("\n", true)
        .context("encoding a newline for XTC's spared tokens")?;
    ids.extend(tokenizer.eos_token_ids().iter().copied());
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
