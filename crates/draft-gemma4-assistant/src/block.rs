//! One assistant block: Q-only attention over a donor's keys and values,
//! then a GeGLU MLP, each between Gemma's sandwich norms, the output scaled
//! by `layer_scalar`. Op order as optiq 0.7.7's `_AssistantBlock`.

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::Array;
use spec_models::DtypePolicy;
use spec_runtime::layers::{Activation, GatedMlp, Linear, RmsNorm};
use spec_runtime::mask::hide_first_keys;
use spec_runtime::rope::Rope;
use spec_runtime::weights::WeightsView;

use crate::config::{AssistantConfig, LayerKind};
use crate::AssistantError;

/// Keys and values one block attends over: `[1, kv_heads, T, head_dim]`,
/// oldest first, the `T` positions just before the query's anchor.
#[derive(Debug, Clone)]
pub struct DonorKv {
    /// Keys, time-ordered.
    pub keys: Array,
    /// Values, time-ordered.
    pub values: Array,
}

impl DonorKv {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.keys.shape().get(2).copied().unwrap_or(0).max(0) as usize
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug)]
struct Attention {
    q: Linear,
    o: Linear,
    q_norm: RmsNorm,
    rope: Rope,
    heads: i32,
    /// The config's `num_key_value_heads`.
    kv_heads: i32,
    head_dim: i32,
}

/// One decoder block of the drafter.
#[derive(Debug)]
pub struct Block {
    kind: LayerKind,
    attn: Attention,
    mlp: GatedMlp,
    input_norm: RmsNorm,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    post_feedforward_norm: RmsNorm,
    layer_scalar: Array,
    sliding_window: usize,
}

impl Block {
    /// Loads block `index`, which `vb` reads (`model.layers.{index}`).
    pub fn load(
        vb: &WeightsView<'_>,
        c: &AssistantConfig,
        index: usize,
    ) -> Result<Self, AssistantError> {
        let kind = c.layers[index];
        let head_dim = c.head_dim_of(kind);
        let qd = c.heads * head_dim;
        let rope = match kind {
            LayerKind::Sliding => Rope::Base {
                dims: head_dim,
                base: c.rope_theta_sliding,
                scale: 1.0,
                traditional: false,
            },
            LayerKind::Full => {
                let rotated = (head_dim as f32 * c.full_partial_rotary_factor) as i32;
                // optiq builds mlx-lm's ProportionalRoPE with factor 1.
                Rope::proportional(head_dim, rotated, c.rope_theta_full, 1.0, false)?
            }
        };
        let norm = |name: &str, dim: i32| RmsNorm::load(&vb.pp(name), dim, c.eps);
        let linear = |name: &str, i: i32, o: i32| Linear::load(&vb.pp(name), i, o, false);
        let attn = Attention {
            q: linear("self_attn.q_proj", c.hidden, qd)?,
            o: linear("self_attn.o_proj", qd, c.hidden)?,
            q_norm: norm("self_attn.q_norm", head_dim)?,
            rope,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim,
        };
        let gelu = Activation::GeluApprox;
        let mlp = GatedMlp::load(&vb.pp("mlp"), c.hidden, c.intermediate, false, gelu)?;
        let layer_scalar = vb.take_shaped("layer_scalar", &[1])?;
        let layer_scalar = if vb.policy() == DtypePolicy::Float32 {
            layer_scalar.as_dtype(mlx_rs::Dtype::Float32)?
        } else {
            layer_scalar
        };
        Ok(Self {
            kind,
            attn,
            mlp,
            input_norm: norm("input_layernorm", c.hidden)?,
            post_attention_norm: norm("post_attention_layernorm", c.hidden)?,
            pre_feedforward_norm: norm("pre_feedforward_layernorm", c.hidden)?,
            post_feedforward_norm: norm("post_feedforward_layernorm", c.hidden)?,
            layer_scalar,
            sliding_window: c.sliding_window,
        })
    }

    /// The donor kind this block reads.
    pub fn kind(&self) -> LayerKind {
        self.kind
    }

    /// Bytes of its weights.
    pub fn nbytes(&self) -> usize {
        let a = &self.attn;
        a.q.nbytes()
            + a.o.nbytes()
            + a.q_norm.nbytes()
            + self.mlp.nbytes()
            + self.input_norm.nbytes()
            + self.post_attention_norm.nbytes()
            + self.pre_feedforward_norm.nbytes()
            + self.post_feedforward_norm.nbytes()
            + self.layer_scalar.nbytes()
    }

    /// optiq's sliding mask: the donor rows are taken to cover positions
    /// `position - T + 1 ..= position`; rows older than the window get -1e9.
    /// `None` when every row is inside the window (always, for donors cut to
    /// `window - 1` rows from a target of the same window).
    fn sliding_mask(&self, rows: usize, position: usize) -> Result<Option<Array>, AssistantError> {
        if self.kind != LayerKind::Sliding {
            return Ok(None);
        }
        let (rows, position, window) = (rows as i64, position as i64, self.sliding_window as i64);
        let first_cached = position - rows + 1;
        let window_start = (position - window + 1).max(0);
        let allowed_from = (window_start - first_cached).max(0);
        if allowed_from == 0 {
            return Ok(None);
        }
        Ok(Some(hide_first_keys(rows as i32, allowed_from as i32)?))
    }

    fn attend(&self, x: &Array, donor: &DonorKv, position: usize) -> Result<Array, AssistantError> {
        let a = &self.attn;
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let kv_shape = donor.keys.shape();
        let kv_heads = kv_shape.get(1).copied().unwrap_or(0);
        // optiq repeats the donor heads `heads / num_key_value_heads` times
        // and leaves any further grouping to the SDPA; the same here.
        let groups = a.heads / a.kv_heads;
        if kv_shape.len() != 4
            || kv_heads <= 0
            || a.heads % (kv_heads * groups) != 0
            || kv_shape[3] != a.head_dim
            || donor.values.shape() != kv_shape
        {
            return Err(AssistantError::Donors(format!(
                "a {:?} block ({} query heads, {} per key head) needs keys and values [1, kv_heads, T, {}] with kv_heads grouping the query heads; got keys {:?}, values {:?}",
                self.kind,
                a.heads,
                groups,
                a.head_dim,
                kv_shape,
                donor.values.shape()
            )));
        }
        let q = a.q.forward(x)?.reshape(&[b, l, a.heads, a.head_dim])?;
        let q = a.q_norm.forward(&q)?.transpose_axes(&[0, 2, 1, 3])?;
        let q = a.rope.apply(&q, position)?;
        let (keys, values) = if groups > 1 {
            (
                Array::repeat_axis::<f32>(donor.keys.clone(), groups, 1)?,
                Array::repeat_axis::<f32>(donor.values.clone(), groups, 1)?,
            )
        } else {
            (donor.keys.clone(), donor.values.clone())
        };
        let mask = self.sliding_mask(donor.len(), position)?;
        let out = match &mask {
            Some(m) => mlx_rs::fast::scaled_dot_product_attention(
                &q,
                &keys,
                &values,
                1.0,
                ScaledDotProductAttentionMask::Array(m),
                None,
            )?,
            None => {
                mlx_rs::fast::scaled_dot_product_attention(&q, &keys, &values, 1.0, None, None)?
            }
        };
        let out = out
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, l, a.heads * a.head_dim])?;
        Ok(a.o.forward(&out)?)
    }

    /// Runs the block on `h` (`[1, L, hidden]`) with its query at `position`.
    pub fn forward(
        &self,
        h: &Array,
        donor: &DonorKv,
        position: usize,
    ) -> Result<Array, AssistantError> {
        let attn = self.attend(&self.input_norm.forward(h)?, donor, position)?;
        let h = h.add(self.post_attention_norm.forward(&attn)?)?;
        let x = self.pre_feedforward_norm.forward(&h)?;
        let ff = self.mlp.forward(&x)?;
        let h = h.add(self.post_feedforward_norm.forward(&ff)?)?;
        Ok(h.multiply(&self.layer_scalar)?)
    }
}
