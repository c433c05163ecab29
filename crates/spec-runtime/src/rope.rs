//! Rotary position embeddings, in the variants mlx-lm's `initialize_rope`
//! builds, computed with the same MLX ops (so the frequencies match bit for bit).

use std::path::Path;

use mlx_ext::rope::RopeFreqs;
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
    /// `mx.fast.rope` with precomputed frequencies (`llama3`, `yarn`).
    Freqs {
        /// Rotated dimensions.
        dims: i32,
        /// Per-pair frequencies.
        freqs: Array,
        /// GPT-J style pairs instead of halves.
        traditional: bool,
        /// What the rotated dimensions of the input are multiplied by
        /// first (mlx-lm's `YarnRoPE.mscale`; 1: nothing).
        input_scale: f32,
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
                    input_scale: 1.0,
                })
            }
            "yarn" | "deepseek_yarn" => {
                let factor = num("factor")
                    .ok_or_else(|| bad(format!("rope_scaling {kind}: missing factor")))?;
                let yarn = Yarn {
                    factor,
                    original: num("original_max_position_embeddings").unwrap_or(4096.0),
                    beta_fast: num("beta_fast").unwrap_or(32.0),
                    beta_slow: num("beta_slow").unwrap_or(1.0),
                    mscale: num("mscale").unwrap_or(1.0),
                    mscale_all_dim: num("mscale_all_dim").unwrap_or(0.0),
                };
                if !(factor > 0.0 && yarn.original > 0.0 && yarn.beta_slow > 0.0) {
                    return Err(bad(format!(
                        "rope_scaling {kind}: factor, original_max_position_embeddings and beta_slow must be positive"
                    )));
                }
                Ok(Rope::Freqs {
                    dims,
                    freqs: yarn.freqs(dims, base)?,
                    traditional,
                    input_scale: yarn.input_scale(),
                })
            }
            other => Err(bad(format!(
                "rope_scaling type `{other}` is not supported (default, linear, llama3, yarn are)"
            ))),
        }
    }

    /// Rotates `x` whose first position is `offset`.
    pub fn apply(&self, x: &Array, offset: usize) -> Result<Array, ModelError> {
        let offset = i32::try_from(offset).map_err(|_| {
            ModelError::Spec(
                spec_core::InputError::TooLarge {
                    what: "position",
                    value: offset,
                }
                .into(),
            )
        })?;
        let x = &self.scaled_input(x)?;
        let (dims, traditional, freqs, scale) = self.params();
        Ok(match freqs {
            RopeFreqs::Base(base) => {
                mlx_rs::fast::rope(x, dims, traditional, base, scale, offset, None)?
            }
            RopeFreqs::Freqs(f) => {
                mlx_rs::fast::rope(x, dims, traditional, None, scale, offset, f)?
            }
        })
    }

    /// Rotated dimensions, the traditional (interleaved) form, the
    /// frequencies and the position scale: what both forms take.
    fn params(&self) -> (i32, bool, RopeFreqs<'_>, f32) {
        match self {
            Rope::Base {
                dims,
                base,
                scale,
                traditional,
            } => (*dims, *traditional, RopeFreqs::Base(*base), *scale),
            Rope::Freqs {
                dims,
                freqs,
                traditional,
                ..
            } => (*dims, *traditional, RopeFreqs::Freqs(freqs), 1.0),
        }
    }

    /// `x` with its rotated dimensions multiplied by the input scale, as
    /// mlx-lm's `YarnRoPE` does before rotating (a Python float: it takes
    /// `x`'s dtype); `x` itself where there is none.
    fn scaled_input(&self, x: &Array) -> Result<Array, ModelError> {
        let (dims, s) = match self {
            Rope::Freqs {
                dims, input_scale, ..
            } if *input_scale != 1.0 => (*dims, *input_scale),
            _ => return Ok(x.clone()),
        };
        let s = Array::from_f32(s).as_dtype(x.dtype())?;
        let width = x.shape().last().copied().unwrap_or(0);
        if dims >= width {
            return Ok(x.multiply(&s)?);
        }
        use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
        let rotated = x.index((Ellipsis, ..dims)).multiply(&s)?;
        let rest = x.index((Ellipsis, dims..));
        Ok(mlx_rs::ops::concatenate(&[rotated, rest], -1)?)
    }
}

impl Rope {
    /// Rotates `x` (`[B, heads, L, D]`) whose row `b` starts at
    /// `offsets[b]` (`[B]`, int32): the bits of [`Rope::apply`] on each row
    /// alone at its offset (MLX computes both with the same element-wise
    /// sequence; the tests below check every variant).
    pub fn apply_rows(&self, x: &Array, offsets: &Array) -> Result<Array, ModelError> {
        let x = &self.scaled_input(x)?;
        let (dims, traditional, freqs, scale) = self.params();
        Ok(mlx_ext::rope::rope_rows(
            x,
            dims,
            traditional,
            freqs,
            scale,
            offsets,
        )?)
    }

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
            input_scale: 1.0,
        })
    }
}

/// mlx-lm's `YarnRoPE` parameters (`rope_scaling` type `yarn`).
struct Yarn {
    factor: f64,
    original: f64,
    beta_fast: f64,
    beta_slow: f64,
    mscale: f64,
    mscale_all_dim: f64,
}

impl Yarn {
    /// `yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor,
    /// mscale_all_dim)`, in Python's doubles.
    fn input_scale(&self) -> f32 {
        let get = |m: f64| {
            if self.factor <= 1.0 {
                1.0
            } else {
                0.1 * m * self.factor.ln() + 1.0
            }
        };
        (get(self.mscale) / get(self.mscale_all_dim)) as f32
    }

    /// The per-pair frequencies: the extrapolated ones (`base^(i/dims)`)
    /// and the interpolated ones (times `factor`) blended over the
    /// correction range, with MLX's ops in mlx-lm's order.
    fn freqs(&self, dims: i32, base: f32) -> Result<Array, ModelError> {
        let f = |v: f64| Array::from_f32(v as f32);
        let d = f64::from(dims);
        let correction = |rotations: f64| {
            (d * (self.original / (rotations * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * f64::from(base).ln())
        };
        let low = correction(self.beta_fast).floor().max(0.0);
        let high = correction(self.beta_slow).ceil().min(d - 1.0);
        // `yarn_linear_ramp_mask`: a degenerate range is widened.
        let span = if low == high {
            (high + 0.001) - low
        } else {
            high - low
        };
        let exponents = arange::<_, f32>(0, dims, 2)?.divide(Array::from_int(dims))?;
        let extra = power(Array::from_f32(base), &exponents)?;
        let inter = f(self.factor).multiply(&extra)?;
        let ramp = arange::<_, f32>(0, dims / 2, 1)?
            .subtract(f(low))?
            .divide(f(span))?;
        let ramp = mlx_rs::ops::clip(&ramp, (0.0f32, 1.0f32))?;
        let mask = f(1.0).subtract(&ramp)?;
        let freqs = inter.multiply(&extra)?.divide(
            inter
                .multiply(&mask)?
                .add(extra.multiply(f(1.0).subtract(&mask)?)?)?,
        )?;
        freqs.eval()?;
        Ok(freqs)
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

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Dtype;
    use serde_json::json;

    /// Positions the tests rotate at: the first, around the cache's growth
    /// step (256) and far out.
    const POSITIONS: &[i32] = &[
        0, 1, 2, 7, 255, 256, 257, 511, 1000, 4095, 4096, 8191, 32767,
    ];

    fn variants() -> Vec<(&'static str, Rope)> {
        let path = Path::new("config.json");
        let new = |dims, traditional, scaling: Option<Value>| {
            Rope::new(dims, 10_000.0, traditional, scaling.as_ref(), path).expect("rope")
        };
        let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let yarn = json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 4096});
        vec![
            ("default", new(64, false, None)),
            ("default traditional", new(64, true, None)),
            (
                "linear",
                new(64, false, Some(json!({"type": "linear", "factor": 4.0}))),
            ),
            ("llama3", new(64, false, Some(llama3.clone()))),
            ("llama3 traditional", new(64, true, Some(llama3))),
            ("yarn", new(64, false, Some(yarn.clone()))),
            // Half the dimensions rotated: only they take the input scale.
            ("yarn partial", new(32, false, Some(yarn))),
            (
                "proportional",
                Rope::proportional(64, 16, 10_000.0, 1.0, false).expect("rope"),
            ),
            (
                "partial rotation",
                Rope::Base {
                    dims: 32,
                    base: 1_000_000.0,
                    scale: 1.0,
                    traditional: false,
                },
            ),
        ]
    }

    fn bits(a: &Array) -> Vec<u32> {
        let a = a.as_dtype(Dtype::Float32).expect("f32");
        a.eval().expect("eval");
        a.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
    }

    /// Every variant, float32 and bfloat16, windows of 1 and 5: a row
    /// rotated with the others by an offset array is the row rotated alone.
    #[test]
    fn rows_rotated_together_equal_rows_rotated_alone() {
        use mlx_rs::ops::indexing::IndexOp;
        let b = POSITIONS.len() as i32;
        let key = mlx_rs::random::key(7).expect("key");
        for (name, rope) in variants() {
            for dtype in [Dtype::Float32, Dtype::Bfloat16] {
                for l in [1, 5] {
                    let x = mlx_rs::random::normal::<f32>(&[b, 3, l, 64], None, None, &key)
                        .and_then(|x| x.as_dtype(dtype))
                        .expect("x");
                    let offsets = Array::from_slice(POSITIONS, &[b]);
                    let together = rope.apply_rows(&x, &offsets).expect("rows");
                    assert_eq!(together.dtype(), dtype);
                    for (r, &p) in POSITIONS.iter().enumerate() {
                        let r = r as i32;
                        let row = x.index((r..r + 1, .., .., ..));
                        let alone = rope.apply(&row, p as usize).expect("alone");
                        assert_eq!(
                            bits(&together.index((r..r + 1, .., .., ..))),
                            bits(&alone),
                            "{name}, {dtype:?}, L {l}, position {p}"
                        );
                    }
                }
            }
        }
    }
}
