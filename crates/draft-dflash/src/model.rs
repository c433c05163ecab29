//! The DFlash drafter (z-lab, "DFlash: Block Diffusion for Flash Speculative
//! Decoding", arXiv 2602.06036), checkpoint classes `DFlashDraftModel` and
//! `DFlash2DraftModel`. Facts from `dflash` 0.1.0's `model_mlx.py`; the op
//! sequence is ours.
//!
//! - Context: the target's tapped hidden states `[1, L, taps * H]` are
//!   projected once (`hidden_norm(fc(taps))`) and turned into per-layer keys
//!   (`k_norm(k_proj(.))`, RoPE at their positions) and values (`v_proj`).
//! - Block: `[anchor, mask x (W - 1)]` at positions `ctx .. ctx + W`,
//!   embedded by the target (times `input_embedding_scale`), through
//!   Qwen3-style layers (pre-norm attention with `q_norm` / `k_norm`, SwiGLU
//!   MLP) whose attention runs over `[context ++ block]` (masks: see
//!   `attention`); final norm on the masks' rows, the target's head (before
//!   the target's own softcap), times `output_multiplier`, softcap. Block position `j >= 1`
//!   proposes the token at its own position: `W - 1` drafts per forward.
//! - DFlash2: each sublayer's normed input goes through a grouped dynamic
//!   causal convolution (`conv`) and its output through the second half,
//!   the residual around both; the drafts are chained by the candidate
//!   selector (`selector`) instead of taken per position.

use std::path::Path;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{Sampler, Target};
use spec_runtime::block_source::BlockProposal;
use spec_runtime::drafter_error::DrafterError;
use spec_runtime::layers::{softcap, Activation, GatedMlp, Linear, RmsNorm};
use spec_runtime::rope::Rope;
use spec_runtime::tap_context::TapContext;
use spec_runtime::weights::Weights;
use spec_runtime::{DtypePolicy, LoadOptions};

use crate::attention::Attention;
use crate::config::DFlashConfig;
use crate::conv::GroupedConv;
use crate::selector::CandidateSelector;
use crate::DFlashError;

#[derive(Debug)]
struct Layer {
    attn: Attention,
    mlp: GatedMlp,
    input_norm: RmsNorm,
    post_attention_norm: RmsNorm,
    /// DFlash2's `attention_conv` and `mlp_conv`.
    convs: Option<(GroupedConv, GroupedConv)>,
}

impl Layer {
    fn nbytes(&self) -> usize {
        self.attn.nbytes()
            + self.mlp.nbytes()
            + self.input_norm.nbytes()
            + self.post_attention_norm.nbytes()
            + self
                .convs
                .as_ref()
                .map_or(0, |(a, m)| a.nbytes() + m.nbytes())
    }
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
    /// DFlash2's `candidate_selector`.
    selector: Option<CandidateSelector>,
    weights_bytes: usize,
}

fn check_shape(what: &str, a: &Array, width: i32) -> Result<(), DFlashError> {
    let s = a.shape();
    if s.len() == 3 && s[0] == 1 && s[2] == width {
        return Ok(());
    }
    Err(DrafterError::Shape {
        what: what.to_owned(),
        found: s.to_vec(),
        expected: format!("[1, L, {width}]"),
    }
    .into())
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
    /// Loads a `DFlashDraftModel` or `DFlash2DraftModel` directory (`config.json` + safetensors),
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
            let convs = match &c.dflash2 {
                Some(d) => Some((
                    GroupedConv::load(&p.pp("attention_conv"), c.hidden, d)?,
                    GroupedConv::load(&p.pp("mlp_conv"), c.hidden, d)?,
                )),
                None => None,
            };
            layers.push(Layer {
                attn: Attention::load(&p.pp("self_attn"), c, i)?,
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
                convs,
            });
        }
        let norm = RmsNorm::load(&vb.pp("norm"), c.hidden, c.eps)?;
        let selector = match &c.dflash2 {
            Some(d) => Some(CandidateSelector::load(
                &vb.pp("candidate_selector"),
                c.hidden,
                c.vocab,
                d,
            )?),
            None => None,
        };
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
            + layers.iter().map(Layer::nbytes).sum::<usize>()
            + selector.as_ref().map_or(0, CandidateSelector::nbytes);
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
            selector,
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
        self.logits(target, &self.block_hidden(target, ctx, anchor, width)?)
    }

    /// The final (normed) hidden states of the masks' rows of one block
    /// forward, `[1, width - 1, H]`.
    fn block_hidden(
        &self,
        target: &dyn Target,
        ctx: &TapContext,
        anchor: u32,
        width: usize,
    ) -> Result<Array, DFlashError> {
        let c = &self.config;
        if !(2..=c.block_size).contains(&width) {
            return Err(DrafterError::Shape {
                what: "the draft block".into(),
                found: vec![width as i32],
                expected: format!("a width in 2..={}", c.block_size),
            }
            .into());
        }
        let mut ids = vec![c.mask_token_id; width];
        ids[0] = anchor;
        let ids = Array::from_slice(&ids, &[1, width as i32]);
        let mut h = scaled(target.embed(&ids)?, c.input_embedding_scale)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let attend = |x: &Array| {
                layer
                    .attn
                    .forward(x, c, &self.rope, ctx.layer(i), ctx.len())
            };
            h = match &layer.convs {
                None => {
                    let h1 = h.add(&attend(&layer.input_norm.forward(&h)?)?)?;
                    let m = layer
                        .mlp
                        .forward(&layer.post_attention_norm.forward(&h1)?)?;
                    h1.add(&m)?
                }
                Some((attention_conv, mlp_conv)) => {
                    let (x, kernel) = attention_conv.prepare(&layer.input_norm.forward(&h)?)?;
                    let h1 = h.add(&attention_conv.finish(&attend(&x)?, &kernel)?)?;
                    let (x, kernel) = mlp_conv.prepare(&layer.post_attention_norm.forward(&h1)?)?;
                    h1.add(&mlp_conv.finish(&layer.mlp.forward(&x)?, &kernel)?)?
                }
            };
        }
        Ok(self.norm.forward(&h.index((.., 1.., ..)))?)
    }

    /// The target's head over `h` (before the target's own softcap, as
    /// z-lab's `lm_head`), times `output_multiplier`, softcapped.
    fn logits(&self, target: &dyn Target, h: &Array) -> Result<Array, DFlashError> {
        let c = &self.config;
        let logits = scaled(target.logits_before_softcap(h)?, c.output_multiplier)?;
        Ok(match c.softcap {
            Some(s) => softcap(&logits, s)?,
            None => logits,
        })
    }

    /// The draft of one round: the block forward of `width` positions,
    /// then one token per mask drawn with `sampler` (DFlash2: chained by
    /// the candidate selector).
    pub fn propose(
        &self,
        target: &dyn Target,
        ctx: &TapContext,
        anchor: u32,
        width: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<BlockProposal, DFlashError> {
        let h = self.block_hidden(target, ctx, anchor, width)?;
        let logits = self.logits(target, &h)?;
        let (drawn, logprobs) = match &self.selector {
            Some(selector) => {
                let chain = selector.select(&h, &logits, anchor, sampler)?;
                (chain.tokens, chain.logprobs)
            }
            None => {
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
                (concatenate(&chain, 0)?, logprobs)
            }
        };
        drawn.eval()?;
        let tokens = drawn.as_slice::<u32>().to_vec();
        if tokens.len() != width - 1 {
            return Err(DrafterError::Shape {
                what: "the sampled tokens".into(),
                found: drawn.shape().to_vec(),
                expected: format!("[{}]", width - 1),
            }
            .into());
        }
        Ok(BlockProposal {
            tokens,
            logprobs,
            confidences: None,
        })
    }
}
