//! The DFlash drafter (z-lab, "DFlash: Block Diffusion for Flash Speculative
//! Decoding", arXiv 2602.06036), checkpoint class `DFlashDraftModel`. Facts
//! from `dflash` 0.1.0's `model_mlx.py`; the op sequence is ours.
//!
//! - Context: the target's tapped hidden states `[1, L, taps * H]` are
//!   projected once (`hidden_norm(fc(taps))`) and turned into per-layer keys
//!   (`k_norm(k_proj(.))`, RoPE at their positions) and values (`v_proj`).
//! - Block: `[anchor, mask x (W - 1)]` at positions `ctx .. ctx + W`,
//!   embedded by the target (times `input_embedding_scale`), through
//!   Qwen3-style layers (pre-norm attention with `q_norm` / `k_norm`, SwiGLU
//!   MLP) whose attention is non-causal over `[context ++ block]`; final
//!   norm on the masks' rows, the target's head, times `output_multiplier`,
//!   softcap. Block position `j >= 1` proposes the token at its own
//!   position: `W - 1` drafts per forward.

use std::path::Path;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{Sampler, Target};
use spec_runtime::layers::{softcap, Activation, GatedMlp, Linear, RmsNorm};
use spec_runtime::rope::Rope;
use spec_runtime::tap_context::TapContext;
use spec_runtime::weights::{Weights, WeightsView};
use spec_runtime::{DtypePolicy, LoadOptions};

use crate::config::DFlashConfig;
use crate::DFlashError;

#[derive(Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
}

#[derive(Debug)]
struct Layer {
    attn: Attention,
    mlp: GatedMlp,
    input_norm: RmsNorm,
    post_attention_norm: RmsNorm,
}

/// One block forward's proposal.
#[derive(Debug)]
pub struct BlockProposal {
    /// One token per mask of the block.
    pub tokens: Vec<u32>,
    /// The log-probabilities each token was drawn from, `[1, V]` per token.
    pub logprobs: Vec<Array>,
}

/// A loaded DFlash drafter (its embeddings and head are the target's).
#[derive(Debug)]
pub struct DFlashModel {
    config: DFlashConfig,
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rope: Rope,
    weights_bytes: usize,
}

impl Attention {
    fn load(vb: &WeightsView<'_>, c: &DFlashConfig) -> Result<Self, DFlashError> {
        let (qd, kd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        Ok(Self {
            q: Linear::load(&vb.pp("q_proj"), c.hidden, qd, false)?,
            k: Linear::load(&vb.pp("k_proj"), c.hidden, kd, false)?,
            v: Linear::load(&vb.pp("v_proj"), c.hidden, kd, false)?,
            o: Linear::load(&vb.pp("o_proj"), qd, c.hidden, false)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), c.head_dim, c.eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), c.head_dim, c.eps)?,
        })
    }

    fn nbytes(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .map(|l| l.nbytes())
            .sum::<usize>()
            + self.q_norm.nbytes()
            + self.k_norm.nbytes()
    }

    /// Keys `[1, kv_heads, L, D]` (normed, rotated from `offset`) and values
    /// of `x` `[1, L, H]`.
    fn keys_values(
        &self,
        x: &Array,
        c: &DFlashConfig,
        rope: &Rope,
        offset: usize,
    ) -> Result<(Array, Array), DFlashError> {
        let l = x.shape()[1];
        let k = self
            .k
            .forward(x)?
            .reshape(&[1, l, c.kv_heads, c.head_dim])?;
        let keys = rope.apply(
            &self.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?,
            offset,
        )?;
        let values = self
            .v
            .forward(x)?
            .reshape(&[1, l, c.kv_heads, c.head_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        Ok((keys, values))
    }
}

fn check_shape(what: &str, a: &Array, width: i32) -> Result<(), DFlashError> {
    let s = a.shape();
    if s.len() == 3 && s[0] == 1 && s[2] == width {
        return Ok(());
    }
    Err(DFlashError::Shape {
        what: what.to_owned(),
        found: s.to_vec(),
        expected: format!("[1, L, {width}]"),
    })
}

/// `x * s` with `s` in `x`'s dtype (a Python float's weak typing in MLX);
/// `x` itself when `s` is 1.
fn scaled(x: Array, s: f32) -> Result<Array, DFlashError> {
    if s == 1.0 {
        return Ok(x);
    }
    let s = Array::from_f32(s).as_dtype(x.dtype())?;
    Ok(x.multiply(&s)?)
}

impl DFlashModel {
    /// Loads a `DFlashDraftModel` directory (`config.json` + safetensors),
    /// float or mlx-lm affine-quantized, under `options.dtype`.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, DFlashError> {
        let _span = tracing::info_span!("load_dflash", path = %dir.display()).entered();
        let config = DFlashConfig::read(dir)?;
        Self::build(config, Weights::from_dir(dir)?, options.dtype)
    }

    fn build(config: DFlashConfig, w: Weights, policy: DtypePolicy) -> Result<Self, DFlashError> {
        let c = &config;
        let vb = w.view(&c.quantization, policy);
        let fc = Linear::load(&vb.pp("fc"), c.context_width(), c.hidden, false)?;
        let hidden_norm = RmsNorm::load(&vb.pp("hidden_norm"), c.hidden, c.eps)?;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = vb.pp("layers").pp(i);
            layers.push(Layer {
                attn: Attention::load(&p.pp("self_attn"), c)?,
                mlp: GatedMlp::load(
                    &p.pp("mlp"),
                    c.hidden,
                    c.intermediate,
                    false,
                    Activation::Silu,
                )?,
                input_norm: RmsNorm::load(&p.pp("input_layernorm"), c.hidden, c.eps)?,
                post_attention_norm: RmsNorm::load(
                    &p.pp("post_attention_layernorm"),
                    c.hidden,
                    c.eps,
                )?,
            });
        }
        let norm = RmsNorm::load(&vb.pp("norm"), c.hidden, c.eps)?;
        w.finish()?;
        let rope = Rope::new(
            c.head_dim,
            c.rope_theta,
            false,
            c.rope_scaling.as_ref(),
            &c.path,
        )?;
        let weights_bytes = fc.nbytes()
            + hidden_norm.nbytes()
            + norm.nbytes()
            + layers
                .iter()
                .map(|l| {
                    l.attn.nbytes()
                        + l.mlp.nbytes()
                        + l.input_norm.nbytes()
                        + l.post_attention_norm.nbytes()
                })
                .sum::<usize>();
        tracing::info!(
            layers = layers.len(),
            block_size = config.block_size,
            bytes = weights_bytes,
            "DFlash drafter loaded"
        );
        Ok(Self {
            config,
            fc,
            hidden_norm,
            layers,
            norm,
            rope,
            weights_bytes,
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &DFlashConfig {
        &self.config
    }

    /// Bytes of the drafter's own weights (the shared embeddings and head
    /// are the target's).
    pub fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    /// Appends tapped target hidden states `[1, L, taps * H]` (the rows after
    /// the ones already held) to `ctx` as keys and values of every layer.
    pub fn extend_context(&self, ctx: &mut TapContext, taps: &Array) -> Result<(), DFlashError> {
        check_shape("the tapped context", taps, self.config.context_width())?;
        let rows = taps.shape()[1] as usize;
        if rows == 0 {
            return Ok(());
        }
        let x = self.hidden_norm.forward(&self.fc.forward(taps)?)?;
        let fresh = self
            .layers
            .iter()
            .map(|l| l.attn.keys_values(&x, &self.config, &self.rope, ctx.len()))
            .collect::<Result<Vec<_>, _>>()?;
        ctx.append(fresh, rows)?;
        Ok(())
    }

    /// One block forward of `width` positions (`2..=block_size`):
    /// `[anchor, mask x (width - 1)]` at positions `ctx.len() ..`; returns
    /// the logits of the masks' rows, `[1, width - 1, V]`. `ctx` is not changed.
    pub fn block_logits(
        &self,
        target: &dyn Target,
        ctx: &TapContext,
        anchor: u32,
        width: usize,
    ) -> Result<Array, DFlashError> {
        let c = &self.config;
        if !(2..=c.block_size).contains(&width) {
            return Err(DFlashError::Shape {
                what: "the draft block".into(),
                found: vec![width as i32],
                expected: format!("a width in 2..={}", c.block_size),
            });
        }
        let mut ids = vec![c.mask_token_id; width];
        ids[0] = anchor;
        let ids = Array::from_slice(&ids, &[1, width as i32]);
        let mut h = scaled(target.embed(&ids)?, c.input_embedding_scale)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let x = layer.input_norm.forward(&h)?;
            let a = self.attention(&layer.attn, &x, ctx.layer(i), ctx.len())?;
            let h1 = h.add(&a)?;
            let m = layer
                .mlp
                .forward(&layer.post_attention_norm.forward(&h1)?)?;
            h = h1.add(&m)?;
        }
        let h = self.norm.forward(&h.index((.., 1.., ..)))?;
        let logits = scaled(target.logits(&h)?, c.output_multiplier)?;
        Ok(match c.softcap {
            Some(s) => softcap(&logits, s)?,
            None => logits,
        })
    }

    fn attention(
        &self,
        a: &Attention,
        x: &Array,
        ctx: Option<&(Array, Array)>,
        offset: usize,
    ) -> Result<Array, DFlashError> {
        let c = &self.config;
        let l = x.shape()[1];
        let queries = a
            .q_norm
            .forward(&a.q.forward(x)?.reshape(&[1, l, c.heads, c.head_dim])?)?
            .transpose_axes(&[0, 2, 1, 3])?;
        let queries = self.rope.apply(&queries, offset)?;
        let (keys, values) = a.keys_values(x, c, &self.rope, offset)?;
        let (keys, values) = match ctx {
            Some((k0, v0)) => (
                concatenate(&[k0, &keys], 2)?,
                concatenate(&[v0, &values], 2)?,
            ),
            None => (keys, values),
        };
        let scale = f64::from(c.head_dim).powf(-0.5) as f32;
        let out = mlx_rs::fast::scaled_dot_product_attention(
            &queries, &keys, &values, scale, None, None,
        )?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, l, -1])?;
        Ok(a.o.forward(&out)?)
    }

    /// The draft of one round: the block forward of `width` positions, then
    /// one token per mask drawn with `sampler`.
    pub fn propose(
        &self,
        target: &dyn Target,
        ctx: &TapContext,
        anchor: u32,
        width: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<BlockProposal, DFlashError> {
        let logits = self.block_logits(target, ctx, anchor, width)?;
        let mut chain = Vec::with_capacity(width - 1);
        let mut logprobs = Vec::with_capacity(width - 1);
        for j in 0..width - 1 {
            let lp = mlx_ext::softmax::log_softmax(&logits.index((.., j as i32, ..)))?;
            chain.push(
                sampler
                    .sample(&lp)?
                    .as_dtype(Dtype::Uint32)?
                    .reshape(&[1])?,
            );
            logprobs.push(lp);
        }
        let drawn = concatenate(&chain, 0)?;
        drawn.eval()?;
        let tokens = drawn.as_slice::<u32>().to_vec();
        if tokens.len() != width - 1 {
            return Err(DFlashError::Shape {
                what: "the sampled tokens".into(),
                found: drawn.shape().to_vec(),
                expected: format!("[{}]", width - 1),
            });
        }
        Ok(BlockProposal { tokens, logprobs })
    }
}
