//! RoPE scaling from GGUF metadata, as Hugging Face's `rope_scaling`.
//! llama.cpp's converter writes linear and YaRN scaling as metadata keys,
//! and Llama 3's (3.1 and later) as a `rope_freqs` tensor: one factor per
//! rotated frequency, computed from the config's parameters, which
//! [`llama3_scaling`] recovers and checks against every factor.

use serde_json::{json, Value};

use super::{bad, Meta};
use crate::ModelError;

/// The `rope_scaling` block the `{arch}.rope.scaling.*` keys describe
/// (`None`: unscaled).
pub(super) fn scaling(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<Value>, ModelError> {
    let type_key = key("rope.scaling.type");
    let Some(kind) = meta.string(&type_key)? else {
        return Ok(None);
    };
    let factor = || meta.required(&key("rope.scaling.factor"));
    match kind.as_str() {
        "none" => Ok(None),
        "linear" => Ok(Some(json!({"rope_type": "linear", "factor": factor()?}))),
        "yarn" => {
            // Keys with no `rope_scaling` field our RoPE reads: refused rather
            // than dropped.
            for unread in ["yarn_ext_factor", "yarn_attn_factor", "attn_factor", "yarn_log_multiplier"] {
                let unread = key(&format!("rope.scaling.{unread}"));
                if meta.number(&unread)?.is_some() {
                    return Err(bad(
                        meta.path,
                        format!("metadata {unread}: YaRN with this key is not supported"),
                    ));
                }
            }
            let mut block = json!({
                "rope_type": "yarn",
                "factor": factor()?,
                "original_max_position_embeddings":
                    meta.required(&key("rope.scaling.original_context_length"))?,
            });
            for (gguf, hf) in [("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")] {
                if let Some(v) = meta.number(&key(&format!("rope.scaling.{gguf}")))? {
                    block[hf] = v.into();
                }
            }
            Ok(Some(block))
        }
        other => Err(bad(
            meta.path,
            format!("metadata {type_key}: rope scaling `{other}` is not supported (none, linear, yarn are)"),
        )),
    }
}

/// Llama 3's wavelength bounds are `original / high_freq_factor` and
/// `original / low_freq_factor`; every published Llama 3.x uses these two.
const LOW_FREQ_FACTOR: f64 = 1.0;
const HIGH_FREQ_FACTOR: f64 = 4.0;

/// Relative difference allowed between a stored factor and ours: llama.cpp
/// computes them in float32.
const TOLERANCE: f64 = 1e-5;

/// The `rope_scaling` block of rope type `llama3` whose factors are
/// `factors` (`rope_freqs`, one per rotated pair of `head_dim`), with the
/// published low and high frequency factors (1 and 4); the scaling factor
/// is the largest stored factor and the original context length is solved
/// from a factor between the bounds. An error says why when no such block
/// gives every stored factor.
pub(super) fn llama3_scaling(factors: &[f32], base: f64, head_dim: i32) -> Result<Value, String> {
    let half = usize::try_from(head_dim / 2).unwrap_or(0);
    if factors.len() != half {
        return Err(format!(
            "tensor `rope_freqs` has {} factors for a head dimension of {head_dim}",
            factors.len()
        ));
    }
    let wavelens: Vec<f64> = (0..half)
        .map(|i| 2.0 * std::f64::consts::PI * base.powf(2.0 * i as f64 / f64::from(head_dim)))
        .collect();
    let factor = factors.iter().copied().fold(1.0_f32, f32::max) as f64;
    let span = HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR;
    // A factor strictly between 1 and `factor` lies between the bounds:
    // 1 / r = (1 - s) / factor + s, s = (original / wavelen - low) / span.
    let between = factors.iter().zip(&wavelens).find(|(&r, _)| {
        f64::from(r) > 1.0 + TOLERANCE && f64::from(r) < factor * (1.0 - TOLERANCE)
    });
    let original = match between {
        Some((&r, &wavelen)) => {
            let s = (1.0 / f64::from(r) - 1.0 / factor) / (1.0 - 1.0 / factor);
            (wavelen * (s * span + LOW_FREQ_FACTOR)).round()
        }
        // None between: any length that sorts the wavelengths alike gives
        // the same frequencies; the smallest above the kept ones' bound.
        None => {
            let kept = factors
                .iter()
                .zip(&wavelens)
                .filter(|(&r, _)| f64::from(r) <= 1.0 + TOLERANCE)
                .map(|(_, &w)| w)
                .fold(0.0, f64::max);
            (kept * HIGH_FREQ_FACTOR).floor() + 1.0
        }
    };
    let expected = |wavelen: f64| {
        if wavelen < original / HIGH_FREQ_FACTOR {
            1.0
        } else if wavelen > original / LOW_FREQ_FACTOR {
            factor
        } else {
            let s = (original / wavelen - LOW_FREQ_FACTOR) / span;
            1.0 / ((1.0 - s) / factor + s)
        }
    };
    for (i, (&r, &wavelen)) in factors.iter().zip(&wavelens).enumerate() {
        let want = expected(wavelen);
        if (f64::from(r) - want).abs() > TOLERANCE * want {
            return Err(format!(
                "tensor `rope_freqs`: factor {i} is {r}, but Llama 3's rope scaling with factor \
                 {factor}, frequency factors {LOW_FREQ_FACTOR} and {HIGH_FREQ_FACTOR} and an \
                 original context of {original} gives {want}: not a scaling we read"
            ));
        }
    }
    Ok(json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": LOW_FREQ_FACTOR,
        "high_freq_factor": HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": original,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The factors llama.cpp's converter writes for these parameters.
    fn factors(base: f64, head_dim: i32, factor: f64, original: f64) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / base.powf(f64::from(2 * i) / f64::from(head_dim));
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let r = if wavelen < original / HIGH_FREQ_FACTOR {
                    1.0
                } else if wavelen > original / LOW_FREQ_FACTOR {
                    factor
                } else {
                    let s = (original / wavelen - LOW_FREQ_FACTOR)
                        / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR);
                    1.0 / ((1.0 - s) / factor + s)
                };
                r as f32
            })
            .collect()
    }

    #[test]
    fn llama_3_1_and_3_2_parameters_are_recovered() {
        for (factor, head_dim) in [(8.0, 128), (32.0, 64)] {
            let block = llama3_scaling(
                &factors(500_000.0, head_dim, factor, 8192.0),
                500_000.0,
                head_dim,
            )
            .expect("recovered");
            assert_eq!(block["factor"], factor);
            assert_eq!(block["original_max_position_embeddings"], 8192.0);
            assert_eq!(block["low_freq_factor"], 1.0);
            assert_eq!(block["high_freq_factor"], 4.0);
        }
    }

    #[test]
    fn other_frequency_factors_are_refused() {
        // Low and high frequency factors of 2 and 8: not the published pair.
        let mut stored = factors(500_000.0, 128, 8.0, 8192.0);
        for (i, r) in stored.iter_mut().enumerate() {
            if *r > 1.0 && *r < 8.0 {
                *r = (*r + 1.0).min(7.5) - (i as f32) * 1e-3;
            }
        }
        let err = llama3_scaling(&stored, 500_000.0, 128).expect_err("refused");
        assert!(err.contains("not a scaling we read"), "{err}");
        let err = llama3_scaling(&stored[..10], 500_000.0, 128).expect_err("wrong length");
        assert!(err.contains("10 factors"), "{err}");
    }
}
