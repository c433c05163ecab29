//! Rotary position embeddings, in the variants mlx-lm's `initialize_rope`
//! builds, computed with the same MLX ops (so the frequencies match bit for bit).

use std::path::Path;

use mlx_rs::ops::{arange, power, select};
use mlx_rs::Array;
use serde_json::Value;

use crate::ModelError;

/// A RoPE as applied to `[B, heads, L, head_dim]`.
#[derive(Debug)]
pub enum Rope {
    /// `mx.fast.rope` with a base and position scale (`default`, `linear`).
    Base {
        /// Rotated dimensions.
        dims: i32,
        /// Frequency base (rope_theta).
        base: f32,
        /// Position scale (1 / factor for linear scaling).
        scale: f32,
        /// GPT-J style pairs instead of halves.
        traditional: bool,
    },
    /// `mx.fast.rope` with precomputed frequencies (`llama3`).
    Freqs {
        /// Rotated dimensions.
        dims: i32,
        /// Per-pair frequencies.
        freqs: Array,
        /// GPT-J style pairs instead of halves.
        traditional: bool,
    },
}

impl Rope {
    /// Builds the RoPE a config's `rope_theta` / `rope_scaling` describe.
    pub fn new(
        dims: i32,
        base: f32,
        traditional: bool,
        scaling: Option<&Value>,
        config: &Path,
    ) -> Result<Self, ModelError> {
        let bad = |message: String| ModelError::Config {
            path: config.to_path_buf(),
            message,
        };
        let Some(scaling) = scaling.filter(|s| !s.is_null()) else {
            return Ok(Rope::Base {
                dims,
                base,
                scale: 1.0,
                traditional,
            });
        };
        let kind = scaling
            .get("type")
            .or_else(|| scaling.get("rope_type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let num = |key: &str| scaling.get(key).and_then(Value::as_f64);
        match kind {
            "default" => Ok(Rope::Base {
                dims,
                base,
                scale: 1.0,
                traditional,
            }),
            "linear" => {
                let factor = num("factor")
                    .ok_or_else(|| bad("rope_scaling linear: missing factor".into()))?;
                Ok(Rope::Base {
                    dims,
                    base,
                    scale: (1.0 / factor) as f32,
                    traditional,
                })
            }
            "llama3" => {
                let factor = num("factor")
                    .ok_or_else(|| bad("rope_scaling llama3: missing factor".into()))?;
                let low = num("low_freq_factor").unwrap_or(1.0);
                let high = num("high_freq_factor").unwrap_or(4.0);
                let old = num("original_max_position_embeddings").unwrap_or(8192.0);
                if high <= low {
                    return Err(bad(format!("rope_scaling llama3: high_freq_factor {high} must exceed low_freq_factor {low}")));
                }
                let freqs = llama3_freqs(dims, base, factor, low, high, old)?;
                Ok(Rope::Freqs {
                    dims,
                    freqs,
                    traditional,
                })
            }
            other => Err(bad(format!(
                "rope_scaling type `{other}` is not supported (default, linear, llama3 are)"
            ))),
        }
    }

    /// Rotates `x` whose first position is `offset`.
    pub fn apply(&self, x: &Array, offset: usize) -> Result<Array, ModelError> {
        let offset = i32::try_from(offset).map_err(|_| {
            ModelError::Spec(spec_core::SpecError::Invalid(format!(
                "position {offset} too large"
            )))
        })?;
        Ok(match self {
            Rope::Base {
                dims,
                base,
                scale,
                traditional,
            } => mlx_rs::fast::rope(x, *dims, *traditional, *base, *scale, offset, None)?,
            Rope::Freqs {
                dims,
                freqs,
                traditional,
            } => mlx_rs::fast::rope(x, *dims, *traditional, None, 1.0, offset, freqs)?,
        })
    }
}

impl Rope {
    /// mlx-lm's `ProportionalRoPE`: the first `rotated` of `dims` dimensions
    /// turn with frequencies `factor * base^(i / dims)`, the rest (infinite
    /// frequency) stay put.
    pub fn proportional(
        dims: i32,
        rotated: i32,
        base: f32,
        factor: f32,
        traditional: bool,
    ) -> Result<Self, ModelError> {
        let exponents = arange::<_, f32>(0, rotated, 2)?.divide(Array::from_int(dims))?;
        let turning =
            Array::from_f32(factor).multiply(power(Array::from_f32(base), &exponents)?)?;
        let still =
            mlx_rs::ops::full::<f32>(&[(dims - rotated) / 2], Array::from_f32(f32::INFINITY))?;
        let freqs = mlx_rs::ops::concatenate(&[turning, still], 0)?;
        freqs.eval()?;
        Ok(Rope::Freqs {
            dims,
            freqs,
            traditional,
        })
    }
}

/// Llama 3's frequency schedule: long wavelengths divided by `factor`,
/// short ones kept, a smooth blend between.
fn llama3_freqs(
    dims: i32,
    base: f32,
    factor: f64,
    low: f64,
    high: f64,
    old: f64,
) -> Result<Array, ModelError> {
    let f = |v: f64| Array::from_f32(v as f32);
    let low_wavelen = old / low;
    let high_wavelen = old / high;
    let exponents = arange::<_, f32>(0, dims, 2)?.divide(Array::from_int(dims))?;
    let freqs = power(Array::from_f32(base), &exponents)?;
    let wavelens = f(2.0 * std::f64::consts::PI).multiply(&freqs)?;
    let freqs = select(
        &wavelens.gt(f(low_wavelen))?,
        freqs.multiply(f(factor))?,
        &freqs,
    )?;
    let medium = wavelens
        .gt(f(high_wavelen))?
        .logical_and(&wavelens.lt(f(low_wavelen))?)?;
    let smooth = f(old)
        .divide(&wavelens)?
        .subtract(f(low))?
        .divide(f(high - low))?;
    let smooth_freqs = freqs.divide(f(1.0).subtract(&smooth)?.divide(f(factor))?.add(&smooth)?)?;
    Ok(select(&medium, smooth_freqs, freqs)?)
}
