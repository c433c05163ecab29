//! One row's causal conv and gated delta recurrence (`gated_delta.py`'s
//! ops path: `gated_delta_update`, `gated_delta_ops`,
//! `_gated_delta_step_ops`), from the row's cached states.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, conv1d, exp, logaddexp, sigmoid, zeros};
use mlx_rs::{Array, Dtype};

use super::{split, GatedDeltaNet};
use crate::qwen3_next::cache::{DeltaCache, DeltaStates};
use crate::ModelError;

impl GatedDeltaNet {
    /// One row: conv over `[conv state, mixed]`, the recurrence from the
    /// cached state; returns `[B, L, value_heads, value_dim]`. The cache
    /// keeps the states a rollback may return to (`decoding`: a verify
    /// window's, see [`DeltaCache::kept`]).
    pub(super) fn recur_row(
        &self,
        mixed: &Array,
        a: &Array,
        beta_in: &Array,
        cache: &mut DeltaCache,
        decoding: bool,
    ) -> Result<Array, ModelError> {
        let g = self.geometry;
        let (b, l) = (mixed.shape()[0], mixed.shape()[1]);
        let keep = g.kernel - 1;
        let conv_state = match cache.states().0 {
            Some(s) => s.clone(),
            None => zeros::<f32>(&[b, keep, g.conv_channels()])?.as_dtype(mixed.dtype())?,
        };
        let conv_input = concatenate(&[conv_state, mixed.clone()], 1)?;
        let conv_out = conv1d(&conv_input, &self.conv, 1, 0, 1, g.conv_channels())?;
        let conv_out = conv_out.multiply(sigmoid(&conv_out)?)?;
        let [q, k, v] = split::<3>(&conv_out, &[g.keys_width(), 2 * g.keys_width()])?;
        let q = q.reshape(&[b, l, g.key_heads, g.key_dim])?;
        let k = k.reshape(&[b, l, g.key_heads, g.key_dim])?;
        let v = v.reshape(&[b, l, g.value_heads, g.value_dim])?;
        let (q, k) = normalize_qk(&q, &k, g.key_dim)?;
        // `gated_delta_update`.
        let beta = sigmoid(beta_in)?;
        let decay = exp(&exp(self.a_log.as_dtype(Dtype::Float32)?)?
            .negative()?
            .multiply(logaddexp(a.add(&self.dt_bias)?, Array::from_int(0))?)?)?;
        let state = match cache.states().1 {
            Some(s) => s.clone(),
            None => zeros::<f32>(&[b, g.value_heads, g.value_dim, g.key_dim])?,
        };
        // The states of the positions the cache keeps (the others are
        // dropped as the recurrence goes, as mlx-lm drops them).
        let keep_from = l as usize - DeltaCache::kept(l as usize, decoding);
        let inputs = mlx_ext::gated_delta::DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &decay,
            beta: &beta,
            state: &state,
        };
        // The vector kernel where it gives MLX's bits, else MLX's ops (every
        // position's state, of which the cache keeps `keep_from..`).
        let (y, states) = match mlx_ext::gated_delta::recur(inputs, keep_from)? {
            Some(out) => (out.y, out.kept),
            None => {
                let (y, mut states) = mlx_ext::gated_delta::recur_with_mlx(inputs)?;
                (y, states.split_off(keep_from))
            }
        };
        let kept = states
            .into_iter()
            .zip(keep_from as i32 + 1..)
            .map(|(recurrent, at)| DeltaStates {
                conv: conv_input.index((.., at..at + keep, ..)),
                recurrent,
            })
            .collect();
        cache.advance(l as usize, kept);
        Ok(y.as_dtype(q.dtype())?)
    }
}

/// `normalize_qk`: L2-normalised queries and keys (through `rms_norm` with
/// the eps scaled to the mean), the readout scale folded into the queries.
fn normalize_qk(q: &Array, k: &Array, key_dim: i32) -> Result<(Array, Array), ModelError> {
    let inv = f64::from(key_dim).powf(-0.5);
    let eps = (1e-6 * (inv * inv)) as f32;
    // Python scalars take the array's dtype.
    let scalar = |x: f64, a: &Array| Array::from_f32(x as f32).as_dtype(a.dtype());
    let q = scalar(inv * inv, q)?.multiply(mlx_rs::fast::rms_norm(q, None, eps)?)?;
    let k = scalar(inv, k)?.multiply(mlx_rs::fast::rms_norm(k, None, eps)?)?;
    Ok((q, k))
}
