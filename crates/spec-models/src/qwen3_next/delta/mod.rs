//! The Gated DeltaNet layer of `qwen3_next` and `qwen3_5` in mlx-lm 0.32.2's
//! op order (`Qwen3NextGatedDeltaNet`, `qwen3_5.GatedDeltaNet`, and
//! `gated_delta.py`'s ops path, which is what mlx-lm runs off Metal): input
//! projections (fused per key head, or split), a causal depthwise conv over
//! the conv state and the new tokens, L2-normalised queries and keys, the
//! gated delta recurrence token by token (`recurrence`), the gated RMS norm,
//! the output projection.

mod recurrence;

use mlx_rs::ops::{concatenate, split_at_indices};
use mlx_rs::Array;

use super::cache::DeltaCache;
use super::config::{Layout, LinearGeometry};
use crate::batch::Packed;
use crate::layers::{swiglu, Linear};
use crate::weights::WeightsView;
use crate::ModelError;

/// The input projections, as the checkpoint lays them out.
#[derive(Debug)]
enum Projections {
    /// `qwen3_next`: per key head `[q, k, v.., z..]` and `[b.., a..]`.
    Fused { qkvz: Linear, ba: Linear },
    /// `qwen3_5`: queries, keys and values together, then `z`, `b`, `a`.
    Split {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
}

impl Projections {
    fn load(
        vb: &WeightsView<'_>,
        g: LinearGeometry,
        layout: Layout,
        hidden: i32,
    ) -> Result<Self, ModelError> {
        let (keys, values) = (g.keys_width(), g.values_width());
        let linear = |name: &str, out: i32| Linear::load(&vb.pp(name), hidden, out, false);
        Ok(match layout {
            Layout::Fused => Projections::Fused {
                qkvz: linear("in_proj_qkvz", 2 * keys + 2 * values)?,
                ba: linear("in_proj_ba", 2 * g.value_heads)?,
            },
            Layout::Split => Projections::Split {
                qkv: linear("in_proj_qkv", g.conv_channels())?,
                z: linear("in_proj_z", values)?,
                b: linear("in_proj_b", g.value_heads)?,
                a: linear("in_proj_a", g.value_heads)?,
            },
        })
    }

    fn nbytes(&self) -> usize {
        match self {
            Projections::Fused { qkvz, ba } => qkvz.nbytes() + ba.nbytes(),
            Projections::Split { qkv, z, b, a } => {
                qkv.nbytes() + z.nbytes() + b.nbytes() + a.nbytes()
            }
        }
    }

    /// The conv's input (queries, keys and values of every head, `[B, T,
    /// channels]`), the gate `z` (`[B, T, value_heads, value_dim]`), and the
    /// per-head `b` and `a` (`[B, T, value_heads]`).
    fn forward(&self, x: &Array, g: LinearGeometry) -> Result<[Array; 4], ModelError> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (nk, dk, nv, dv) = (g.key_heads, g.key_dim, g.value_heads, g.value_dim);
        match self {
            Projections::Split {
                qkv,
                z,
                b: proj_b,
                a,
            } => Ok([
                qkv.forward(x)?,
                z.forward(x)?.reshape(&[b, t, nv, dv])?,
                proj_b.forward(x)?,
                a.forward(x)?,
            ]),
            Projections::Fused { qkvz, ba } => {
                // `fix_query_key_value_ordering`.
                let per = nv / nk;
                let qkvz = qkvz.forward(x)?.reshape(&[b, t, nk, -1])?;
                let ba = ba.forward(x)?.reshape(&[b, t, nk, -1])?;
                let [q, k, v, z] = split::<4>(&qkvz, &[dk, 2 * dk, 2 * dk + per * dv])?;
                let [beta_in, a] = split::<2>(&ba, &[per])?;
                let mixed = concatenate(
                    &[
                        q.reshape(&[b, t, -1])?,
                        k.reshape(&[b, t, -1])?,
                        v.reshape(&[b, t, -1])?,
                    ],
                    -1,
                )?;
                Ok([
                    mixed,
                    z.reshape(&[b, t, nv, dv])?,
                    beta_in.reshape(&[b, t, nv])?,
                    a.reshape(&[b, t, nv])?,
                ])
            }
        }
    }
}

/// `x` split on its last axis at `at` into `N` parts.
fn split<const N: usize>(x: &Array, at: &[i32]) -> Result<[Array; N], ModelError> {
    <[Array; N]>::try_from(split_at_indices(x, at, -1)?).map_err(|_| {
        ModelError::Spec(spec_core::SpecError::Internal(
            "a split gave another number of parts",
        ))
    })
}

/// One Gated DeltaNet layer's weights.
#[derive(Debug)]
pub(super) struct GatedDeltaNet {
    projections: Projections,
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
        layout: Layout,
        hidden: i32,
        eps: f32,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            projections: Projections::load(vb, g, layout, hidden)?,
            conv: vb
                .pp("conv1d")
                .take_cast("weight", &[g.conv_channels(), g.kernel, 1])?,
            dt_bias: vb.take_cast("dt_bias", &[g.value_heads])?,
            a_log: vb.take_cast("A_log", &[g.value_heads])?,
            norm: vb.pp("norm").take_cast("weight", &[g.value_dim])?,
            out_proj: Linear::load(&vb.pp("out_proj"), g.values_width(), hidden, false)?,
            geometry: g,
            eps,
        })
    }

    pub fn nbytes(&self) -> usize {
        self.projections.nbytes()
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
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let [mixed, z, beta_in, a] = self.projections.forward(x, self.geometry)?;
        let mut outs = Vec::with_capacity(packed.rows.len());
        for r in 0..packed.rows.len() {
            let (mixed, a, beta_in) = (
                packed.slice(&mixed, r)?,
                packed.slice(&a, r)?,
                packed.slice(&beta_in, r)?,
            );
            let decoding = packed.rows[r].form == spec_core::RowForm::Decode;
            let cache = packed.rows[r].cache(layer)?;
            let cache = cache
                .as_any_mut()
                .and_then(|c| c.downcast_mut::<DeltaCache>())
                .ok_or(spec_core::SpecError::Internal(
                    "a Gated DeltaNet layer's cache is not a DeltaCache",
                ))?;
            outs.push(self.recur_row(&mixed, &a, &beta_in, cache, decoding)?);
        }
        let out = Packed::join(outs)?;
        // `RMSNormGated`: rms_norm(out) gated by silu(z), in float32.
        let normed = mlx_rs::fast::rms_norm(&out, Some(&self.norm), self.eps)?;
        let gated = swiglu(&z, &normed)?;
        self.out_proj.forward(&gated.reshape(&[b, t, -1])?)
    }
}
