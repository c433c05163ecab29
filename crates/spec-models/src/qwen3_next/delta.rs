//! The Gated DeltaNet layer of `qwen3_next` in mlx-lm 0.32.2's op order
//! (`Qwen3NextGatedDeltaNet`, `gated_delta.py`'s ops path, which is what it
//! runs off Metal): fused input projections, a causal depthwise conv over
//! the conv state and the new tokens, L2-normalised queries and keys, the
//! gated delta recurrence token by token, the gated RMS norm, the output
//! projection.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, conv1d, exp, logaddexp, sigmoid, split_at_indices, stack, zeros};
use mlx_rs::{Array, Dtype};

use super::cache::DeltaCache;
use super::config::LinearGeometry;
use crate::batch::Packed;
use crate::layers::{swiglu, Linear};
use crate::weights::WeightsView;
use crate::ModelError;

/// One Gated DeltaNet layer's weights.
#[derive(Debug)]
pub(super) struct GatedDeltaNet {
    in_proj_qkvz: Linear,
    in_proj_ba: Linear,
    /// `[channels, kernel, 1]` (MLX's depthwise conv layout).
    conv: Array,
    dt_bias: Array,
    a_log: Array,
    /// The gated RMS norm's scale, `[value_dim]`.
    norm: Array,
    out_proj: Linear,
    geometry: LinearGeometry,
    eps: f32,
}

impl GatedDeltaNet {
    pub fn load(
        vb: &WeightsView<'_>,
        g: LinearGeometry,
        hidden: i32,
        eps: f32,
    ) -> Result<Self, ModelError> {
        let (keys, values) = (g.keys_width(), g.values_width());
        Ok(Self {
            in_proj_qkvz: Linear::load(
                &vb.pp("in_proj_qkvz"),
                hidden,
                2 * keys + 2 * values,
                false,
            )?,
            in_proj_ba: Linear::load(&vb.pp("in_proj_ba"), hidden, 2 * g.value_heads, false)?,
            conv: vb
                .pp("conv1d")
                .take_cast("weight", &[g.conv_channels(), g.kernel, 1])?,
            dt_bias: vb.take_cast("dt_bias", &[g.value_heads])?,
            a_log: vb.take_cast("A_log", &[g.value_heads])?,
            norm: vb.pp("norm").take_cast("weight", &[g.value_dim])?,
            out_proj: Linear::load(&vb.pp("out_proj"), values, hidden, false)?,
            geometry: g,
            eps,
        })
    }

    pub fn nbytes(&self) -> usize {
        self.in_proj_qkvz.nbytes()
            + self.in_proj_ba.nbytes()
            + self.out_proj.nbytes()
            + [&self.conv, &self.dt_bias, &self.a_log, &self.norm]
                .iter()
                .map(|a| a.nbytes())
                .sum::<usize>()
    }

    /// The layer over packed rows `x` (`[1, T, hidden]`): projections over
    /// every token at once, then each row's conv and recurrence over its own
    /// cache (layer `layer` of its set), then the norm and output projection
    /// over every token.
    pub fn forward(
        &self,
        x: &Array,
        packed: &mut Packed<'_>,
        layer: usize,
    ) -> Result<Array, ModelError> {
        let g = self.geometry;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (nk, dk, nv, dv) = (g.key_heads, g.key_dim, g.value_heads, g.value_dim);
        let per = nv / nk;
        // `fix_query_key_value_ordering`: per key head [q, k, v.., z..] and [b.., a..].
        let qkvz = self.in_proj_qkvz.forward(x)?.reshape(&[b, t, nk, -1])?;
        let ba = self.in_proj_ba.forward(x)?.reshape(&[b, t, nk, -1])?;
        let parts = split_at_indices(&qkvz, &[dk, 2 * dk, 2 * dk + per * dv], -1)?;
        let [q, k, v, z] = <[Array; 4]>::try_from(parts)
            .map_err(|_| ModelError::Spec(spec_core::SpecError::Internal("qkvz split")))?;
        let v = v.reshape(&[b, t, nv, dv])?;
        let z = z.reshape(&[b, t, nv, dv])?;
        let parts = split_at_indices(&ba, &[per], -1)?;
        let [beta_in, a] = <[Array; 2]>::try_from(parts)
            .map_err(|_| ModelError::Spec(spec_core::SpecError::Internal("ba split")))?;
        let beta_in = beta_in.reshape(&[b, t, nv])?;
        let a = a.reshape(&[b, t, nv])?;
        let mixed = concatenate(
            &[
                q.reshape(&[b, t, -1])?,
                k.reshape(&[b, t, -1])?,
                v.reshape(&[b, t, -1])?,
            ],
            -1,
        )?;
        let mut outs = Vec::with_capacity(packed.rows.len());
        for r in 0..packed.rows.len() {
            let (mixed, a, beta_in) = (
                packed.slice(&mixed, r)?,
                packed.slice(&a, r)?,
                packed.slice(&beta_in, r)?,
            );
            let cache = packed.rows[r].cache(layer)?;
            let cache = cache
                .as_any_mut()
                .and_then(|c| c.downcast_mut::<DeltaCache>())
                .ok_or(spec_core::SpecError::Internal(
                    "a Gated DeltaNet layer's cache is not a DeltaCache",
                ))?;
            outs.push(self.recur_row(&mixed, &a, &beta_in, cache)?);
        }
        let out = Packed::join(outs)?;
        // `Qwen3NextRMSNormGated`: rms_norm(out) gated by silu(z), in float32.
        let normed = mlx_rs::fast::rms_norm(&out, Some(&self.norm), self.eps)?;
        let gated = swiglu(&z, &normed)?;
        self.out_proj.forward(&gated.reshape(&[b, t, -1])?)
    }

    /// One row: conv over `[conv state, mixed]`, the recurrence from the
    /// cached state; returns `[B, L, value_heads, value_dim]`.
    fn recur_row(
        &self,
        mixed: &Array,
        a: &Array,
        beta_in: &Array,
        cache: &mut DeltaCache,
    ) -> Result<Array, ModelError> {
        let g = self.geometry;
        let (b, l) = (mixed.shape()[0], mixed.shape()[1]);
        let keep = g.kernel - 1;
        let conv_state = match cache.states().0 {
            Some(s) => s.clone(),
            None => zeros::<f32>(&[b, keep, g.conv_channels()])?.as_dtype(mixed.dtype())?,
        };
        let conv_input = concatenate(&[conv_state, mixed.clone()], 1)?;
        let total = conv_input.shape()[1];
        let new_conv = conv_input.index((.., total - keep.., ..));
        let conv_out = conv1d(&conv_input, &self.conv, 1, 0, 1, g.conv_channels())?;
        let conv_out = conv_out.multiply(sigmoid(&conv_out)?)?;
        let parts = split_at_indices(&conv_out, &[g.keys_width(), 2 * g.keys_width()], -1)?;
        let [q, k, v] = <[Array; 3]>::try_from(parts)
            .map_err(|_| ModelError::Spec(spec_core::SpecError::Internal("qkv split")))?;
        let q = q.reshape(&[b, l, g.key_heads, g.key_dim])?;
        let k = k.reshape(&[b, l, g.key_heads, g.key_dim])?;
        let v = v.reshape(&[b, l, g.value_heads, g.value_dim])?;
        let (q, k) = normalize_qk(&q, &k, g.key_dim)?;
        // `gated_delta_update`.
        let beta = sigmoid(beta_in)?;
        let decay = exp(&exp(self.a_log.as_dtype(Dtype::Float32)?)?
            .negative()?
            .multiply(logaddexp(a.add(&self.dt_bias)?, Array::from_int(0))?)?)?;
        let mut state = match cache.states().1 {
            Some(s) => s.clone(),
            None => zeros::<f32>(&[b, g.value_heads, g.value_dim, g.key_dim])?,
        };
        let repeat = g.value_heads / g.key_heads;
        let (q, k) = if repeat > 1 {
            (
                mlx_rs::ops::repeat_axis::<f32>(q, repeat, -2)?,
                mlx_rs::ops::repeat_axis::<f32>(k, repeat, -2)?,
            )
        } else {
            (q, k)
        };
        let mut ys = Vec::with_capacity(l as usize);
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
        }
        let y = stack(&ys, 1)?;
        cache.advance(new_conv, state, l as usize);
        Ok(y)
    }
}

/// `normalize_qk`: L2-normalised queries and keys (through `rms_norm` with
/// the eps scaled to the mean), the readout scale folded into the queries.
fn normalize_qk(q: &Array, k: &Array, key_dim: i32) -> Result<(Array, Array), ModelError> {
    let inv = f64::from(key_dim).powf(-0.5);
    let eps = (1e-6 * (inv * inv)) as f32;
    let q = Array::from_f32((inv * inv) as f32).multiply(mlx_rs::fast::rms_norm(q, None, eps)?)?;
    let k = Array::from_f32(inv as f32).multiply(mlx_rs::fast::rms_norm(k, None, eps)?)?;
    Ok((q, k))
}
