//! The gated full attention of `qwen3_next` (`Qwen3NextAttention` in
//! mlx-lm 0.32.2): the query projection carries an output gate per head,
//! q/k RMS norms, partial rotary, and `o_proj(attention * sigmoid(gate))`.

use mlx_rs::ops::sigmoid;
use mlx_rs::Array;
use spec_core::LayerCache;

use super::config::Config;
use crate::batch::Packed;
use crate::cache::quantized_mut;
use crate::layers::{Linear, RmsNorm};
use crate::mask::{bounded_mask, Window};
use crate::rope::Rope;
use crate::sdpa::{self, Mask};
use crate::weights::WeightsView;
use crate::ModelError;

#[derive(Debug)]
pub(super) struct GatedAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

impl GatedAttention {
    pub fn load(vb: &WeightsView<'_>, c: &Config) -> Result<Self, ModelError> {
        let (h, qd, kd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let bias = c.attention_bias;
        Ok(Self {
            q: Linear::load(&vb.pp("q_proj"), h, 2 * qd, bias)?,
            k: Linear::load(&vb.pp("k_proj"), h, kd, bias)?,
            v: Linear::load(&vb.pp("v_proj"), h, kd, bias)?,
            o: Linear::load(&vb.pp("o_proj"), qd, h, bias)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), c.head_dim, c.eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), c.head_dim, c.eps)?,
            heads: c.heads,
            kv_heads: c.kv_heads,
            scale: f64::from(c.head_dim).powf(-0.5) as f32,
        })
    }

    pub fn nbytes(&self) -> usize {
        self.q.nbytes()
            + self.k.nbytes()
            + self.v.nbytes()
            + self.o.nbytes()
            + self.q_norm.nbytes()
            + self.k_norm.nbytes()
    }

    /// The projections of `x` (`[B, T, hidden]`): queries and keys
    /// normed, `[B, T, heads, D]`, values `[B, T, kv_heads, D]`, and the
    /// output gate `[B, T, heads * D]`.
    fn project(&self, x: &Array) -> Result<[Array; 4], ModelError> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let q_and_gate = self.q.forward(x)?.reshape(&[b, t, self.heads, -1])?;
        let halves = q_and_gate.split_equal(2, -1)?;
        let [queries, gate] = <[Array; 2]>::try_from(halves)
            .map_err(|_| ModelError::Spec(spec_core::SpecError::Internal("query/gate split")))?;
        let gate = gate.reshape(&[b, t, -1])?;
        let keys = self.k.forward(x)?;
        let values = self.v.forward(x)?;
        let queries = self.q_norm.forward(&queries)?;
        let keys = self
            .k_norm
            .forward(&keys.reshape(&[b, t, self.kv_heads, -1])?)?;
        let values = values.reshape(&[b, t, self.kv_heads, -1])?;
        Ok([queries, keys, values, gate])
    }

    /// Attention over the packed rows `x` (`[1, T, hidden]`): projections
    /// over every token, then each row alone over its cache (layer `layer`
    /// of its set) at its own offset.
    /// `window`: the layer's bound (`--max-kv-size`), if any.
    pub fn forward(
        &self,
        x: &Array,
        rope: &Rope,
        packed: &mut Packed<'_>,
        layer: usize,
        window: Option<Window>,
    ) -> Result<Array, ModelError> {
        let [queries, keys, values, gate] = self.project(x)?;
        let mut outs = Vec::with_capacity(packed.rows.len());
        for r in 0..packed.rows.len() {
            let heads_first = |a: &Array| -> Result<Array, ModelError> {
                Ok(packed.slice(a, r)?.transpose_axes(&[0, 2, 1, 3])?)
            };
            let (q, k, v) = (
                heads_first(&queries)?,
                heads_first(&keys)?,
                heads_first(&values)?,
            );
            let cache = packed.rows[r].cache(layer)?;
            outs.push(self.attend_row(q, k, v, rope, cache, window)?);
        }
        let out = Packed::join(outs)?;
        self.o.forward(&out.multiply(sigmoid(&gate)?)?)
    }

    /// Attention over one sequence `x` (`[1, L, hidden]`) and its own
    /// `cache` (the MTP head's layer).
    pub fn forward_alone(
        &self,
        x: &Array,
        rope: &Rope,
        cache: &mut dyn LayerCache,
    ) -> Result<Array, ModelError> {
        let [queries, keys, values, gate] = self.project(x)?;
        let heads_first = |a: &Array| a.transpose_axes(&[0, 2, 1, 3]);
        let out = self.attend_row(
            heads_first(&queries)?,
            heads_first(&keys)?,
            heads_first(&values)?,
            rope,
            cache,
            None,
        )?;
        self.o.forward(&out.multiply(sigmoid(&gate)?)?)
    }

    /// One row: `[B, heads, L, D]` queries, keys and values before RoPE
    /// over `cache`; returns `[B, L, heads * D]`.
    fn attend_row(
        &self,
        queries: Array,
        keys: Array,
        values: Array,
        rope: &Rope,
        cache: &mut dyn LayerCache,
        window: Option<Window>,
    ) -> Result<Array, ModelError> {
        let (b, l) = (queries.shape()[0], queries.shape()[2]);
        let offset = cache.offset();
        let queries = rope.apply(&queries, offset)?;
        let keys = rope.apply(&keys, offset)?;
        let out = match quantized_mut(cache) {
            Some(quantized) => quantized.attend(&queries, &keys, &values, self.scale)?,
            None => {
                let (keys, values) = cache.update_and_fetch(&keys, &values)?;
                let fetched = keys.shape()[2] as usize;
                let mask = bounded_mask(window, offset, l as usize, fetched)?;
                let mask = Mask::or_causal(mask.as_ref(), l as usize);
                sdpa::attention(&queries, &keys, &values, self.scale, mask)?
            }
        };
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}
