//! One row's causal conv and gated delta recurrence (`gated_delta.py`'s
//! ops path: `gated_delta_update`, `gated_delta_ops`,
//! `_gated_delta_step_ops`), from the row's cached states.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, conv1d, exp, logaddexp, sigmoid, stack, zeros};
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
        if let Some(out) = mlx_ext::gated_delta::recur(inputs, keep_from)? {
            let kept = out
                .kept
                .into_iter()
                .enumerate()
                .map(|(i, recurrent)| DeltaStates {
                    conv: conv_input.index((
                        ..,
                        keep_from as i32 + i as i32 + 1..keep_from as i32 + i as i32 + 1 + keep,
                        ..,
                    )),
                    recurrent,
                })
                .collect();
            cache.advance(l as usize, kept);
            return Ok(out.y.as_dtype(q.dtype())?);
        }
        self.recur_with_ops(
            &q,
            &k,
            &v,
            (&decay, &beta),
            state,
            (&conv_input, keep_from),
            cache,
        )
    }

    /// [`Self::recur_row`]'s recurrence in MLX's ops, one position at a
    /// time, where the vector kernel does not give their bits.
    #[allow(clippy::too_many_arguments)]
    fn recur_with_ops(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        (decay, beta): (&Array, &Array),
        mut state: Array,
        (conv_input, keep_from): (&Array, usize),
        cache: &mut DeltaCache,
    ) -> Result<Array, ModelError> {
        let g = self.geometry;
        let (b, l) = (v.shape()[0], v.shape()[1]);
        let keep = g.kernel - 1;
        let keep_from = keep_from as i32;
        let repeat = g.value_heads / g.key_heads;
        let (q, k) = if repeat > 1 {
            (
                mlx_rs::ops::repeat_axis::<f32>(q.clone(), repeat, -2)?,
                mlx_rs::ops::repeat_axis::<f32>(k.clone(), repeat, -2)?,
            )
        } else {
            (q.clone(), k.clone())
        };
        let mut ys = Vec::with_capacity(l as usize);
        let mut kept = Vec::with_capacity((l - keep_from) as usize);
        for s in 0..l {
            let (qs, ks, vs) = (q.index((.., s)), k.index((.., s)), v.index((.., s)));
            let (gs, bs) = (decay.index((.., s)), beta.index((.., s)));
            // `_gated_delta_step_ops`.
            state = state.multiply(gs.reshape(&[b, g.value_heads, 1, 1])?)?;
            let k_row = ks.expand_dims(-2)?;
            let kv_mem = state.multiply(&k_row)?.sum_axis(-1, false)?;
            let delta = vs.subtract(&kv_mem)?.multiply(bs.expand_dims(-1)?)?;
            state = state.add(k_row.multiply(delta.expand_dims(-1)?)?)?;
            let y = state.multiply(qs.expand_dims(-2)?)?.sum_axis(-1, false)?;
            ys.push(y.as_dtype(qs.dtype())?);
            if s >= keep_from {
                kept.push(DeltaStates {
                    conv: conv_input.index((.., s + 1..s + 1 + keep, ..)),
                    recurrent: state.clone(),
                });
            }
        }
        let y = stack(&ys, 1)?;
        cache.advance(l as usize, kept);
        Ok(y)
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
