//! The DSpark drafter (DeepSeek's DeepSpec, "DSpark: Confidence-Scheduled
//! Speculative Decoding with Semi-Autoregressive Generation"), checkpoint
//! class `Gemma4DSparkModel`. Facts from the public `deepseek-ai/DeepSpec`
//! repository (`deepspec/modeling/dspark/gemma4/modeling.py`,
//! `deepspec/eval/dspark/draft_ops.py`); the op sequence is ours, mirrored
//! op for op by `xtask/python/oracle_dspark.py`.
//!
//! - Context: the target's tapped hidden states `[1, L, taps * H]` are
//!   projected once (`hidden_norm(fc(taps))`) and turned into per-layer keys
//!   (`k_norm`, RoPE at their positions) and values (the same `k_proj`
//!   output, scale-free norm, no RoPE): `attention_k_eq_v`.
//! - Block: `[anchor, mask x (B - 1)]` at positions `ctx .. ctx + B`, embedded
//!   and scaled by `sqrt(H)`, through Gemma-4 style blocks (four norms, GELU-tanh
//!   MLP, output times `layer_scalar`) whose attention is non-causal with
//!   scale 1 over `[context ++ block]`; final norm, `lm_head`, softcap. Block
//!   position `j` proposes the token after the `j`-th token of the block.
//! - Markov correction, token by token: `logits_j = base_j +
//!   markov_w2(markov_w1[prev_j])`, `prev_0` = the anchor, `prev_j` = the
//!   token drawn at `j - 1`.
//! - Confidence: `sigmoid(proj([h_j ; markov_w1[prev_j]]))`.

use std::path::Path;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, sigmoid};
use mlx_rs::{Array, Dtype};
use spec_core::Sampler;
use spec_runtime::block_source::BlockProposal;
use spec_runtime::drafter_error::DrafterError;
use spec_runtime::layers::{softcap, Activation, Embedding, GatedMlp, Linear, RmsNorm};
use spec_runtime::rope::Rope;
use spec_runtime::weights::{Weights, WeightsView};
use spec_runtime::{DtypePolicy, LoadOptions};

use crate::config::DSparkConfig;
use crate::DSparkError;

#[derive(Debug)]
struct Attention {
    q: Linear,
    k: Linear,
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
    pre_feedforward_norm: RmsNorm,
    post_feedforward_norm: RmsNorm,
    scalar: Array,
}

#[derive(Debug)]
struct MarkovHead {
    /// `[V, r]`, read as a gather table.
    w1: Embedding,
    /// `[V, r]`, applied as a linear map `r -> V`.
    w2: Linear,
}

/// The projected context of one request (shared with other tapped drafters).
pub type Context = spec_runtime::tap_context::TapContext;

/// A loaded DSpark drafter.
#[derive(Debug)]
pub struct DSparkModel {
    config: DSparkConfig,
    embed: Embedding,
    embed_scale: f32,
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    markov: Option<MarkovHead>,
    confidence: Option<Linear>,
    rope: Rope,
    weights_bytes: usize,
}

fn check_shape(what: &str, a: &Array, expected: &[i32]) -> Result<(), DSparkError> {
    let ok = a.shape().len() == expected.len()
        && a.shape()
            .iter()
            .zip(expected)
            .all(|(&s, &e)| e < 0 || s == e);
    if ok {
        return Ok(());
    }
    let dims: Vec<String> = expected
        .iter()
        .map(|&e| if e < 0 { "L".to_owned() } else { e.to_string() })
        .collect();
    Err(DrafterError::Shape {
        what: what.to_owned(),
        found: a.shape().to_vec(),
        expected: format!("[{}]", dims.join(", ")),
    }
    .into())
}

impl Attention {
    fn load(vb: &WeightsView<'_>, c: &DSparkConfig) -> Result<Self, DSparkError> {
        let (qd, kd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        Ok(Self {
            q: Linear::load(&vb.pp("q_proj"), c.hidden, qd, false)?,
            k: Linear::load(&vb.pp("k_proj"), c.hidden, kd, false)?,
            o: Linear::load(&vb.pp("o_proj"), qd, c.hidden, false)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), c.head_dim, c.eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), c.head_dim, c.eps)?,
        })
    }

    fn nbytes(&self) -> usize {
        self.q.nbytes()
            + self.k.nbytes()
            + self.o.nbytes()
            + self.q_norm.nbytes()
            + self.k_norm.nbytes()
    }
}

impl DSparkModel {
    /// Loads a `Gemma4DSparkModel` directory (`config.json` + safetensors),
    /// float or mlx-lm affine-quantized, under `options.dtype`.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, DSparkError> {
        let _span = tracing::info_span!("load_dspark", path = %dir.display()).entered();
        let (config, _) = DSparkConfig::read(dir)?;
        Self::build(config, Weights::from_dir(dir)?, options.dtype)
    }

    fn build(config: DSparkConfig, w: Weights, policy: DtypePolicy) -> Result<Self, DSparkError> {
        // Rotary frequencies are recomputed, never read (HF keeps them as a buffer).
        w.discard_where(|name| name.contains("rotary_emb."));
        // DeepSpec saves the model's own parameter names; a checkpoint saved
        // through a wrapper has them under `model.`. Either layout loads.
        let c = &config;
        let vb = w.view(&c.quantization, policy);
        let m = if !w.contains("fc.weight") && w.contains("model.fc.weight") {
            vb.pp("model")
        } else {
            vb
        };
        let embed = Embedding::load(&m.pp("embed_tokens"), c.vocab, c.hidden)?;
        let fc = Linear::load(&m.pp("fc"), c.context_width(), c.hidden, false)?;
        let hidden_norm = RmsNorm::load(&m.pp("hidden_norm"), c.hidden, c.eps)?;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = m.pp("layers").pp(i);
            let norm = |name: &str| RmsNorm::load(&p.pp(name), c.hidden, c.eps);
            let (h, inter) = (c.hidden, c.intermediate);
            layers.push(Layer {
                attn: Attention::load(&p.pp("self_attn"), c)?,
                mlp: GatedMlp::load(&p.pp("mlp"), h, inter, false, Activation::GeluApprox)?,
                input_norm: norm("input_layernorm")?,
                post_attention_norm: norm("post_attention_layernorm")?,
                pre_feedforward_norm: norm("pre_feedforward_layernorm")?,
                post_feedforward_norm: norm("post_feedforward_layernorm")?,
                scalar: p.take_cast("layer_scalar", &[1])?,
            });
        }
        let norm = RmsNorm::load(&m.pp("norm"), c.hidden, c.eps)?;
        let lm_head = Linear::load(&m.pp("lm_head"), c.hidden, c.vocab, false)?;
        let markov = if c.markov_rank > 0 {
            let head = m.pp("markov_head");
            Some(MarkovHead {
                w1: Embedding::load(&head.pp("markov_w1"), c.vocab, c.markov_rank)?,
                w2: Linear::load(&head.pp("markov_w2"), c.markov_rank, c.vocab, false)?,
            })
        } else {
            None
        };
        let confidence = if c.confidence_head {
            let width = c.hidden
                + if c.confidence_with_markov {
                    c.markov_rank
                } else {
                    0
                };
            Some(Linear::load(&m.pp("confidence_head.proj"), width, 1, true)?)
        } else {
            None
        };
        w.finish()?;
        let rotated = (f64::from(c.head_dim) * c.rope.partial_rotary_factor) as i32;
        let rope = Rope::proportional(c.head_dim, rotated, c.rope.theta, c.rope.factor, false)?;
        let mut model = Self {
            embed_scale: (f64::from(c.hidden)).sqrt() as f32,
            config,
            embed,
            fc,
            hidden_norm,
            layers,
            norm,
            lm_head,
            markov,
            confidence,
            rope,
            weights_bytes: 0,
        };
        model.weights_bytes = model.count_bytes();
        tracing::info!(
            layers = model.layers.len(),
            block_size = model.config.block_size,
            bytes = model.weights_bytes,
            "DSpark drafter loaded"
        );
        Ok(model)
    }

    fn count_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn.nbytes()
                    + l.mlp.nbytes()
                    + l.input_norm.nbytes()
                    + l.post_attention_norm.nbytes()
                    + l.pre_feedforward_norm.nbytes()
                    + l.post_feedforward_norm.nbytes()
                    + l.scalar.nbytes()
            })
            .sum();
        let markov = self
            .markov
            .as_ref()
            .map_or(0, |m| m.w1.nbytes() + m.w2.nbytes());
        layers
            + markov
            + self.embed.nbytes()
            + self.fc.nbytes()
            + self.hidden_norm.nbytes()
            + self.norm.nbytes()
            + self.lm_head.nbytes()
            + self.confidence.as_ref().map_or(0, Linear::nbytes)
    }

    /// The validated configuration.
    pub fn config(&self) -> &DSparkConfig {
        &self.config
    }

    /// Bytes of all weights, as held in memory.
    pub fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    /// `projectContext`: tapped target hidden states `[1, L, taps * H]` ->
    /// `hidden_norm(fc(taps))`, `[1, L, H]`.
    pub fn project_context(&self, taps: &Array) -> Result<Array, DSparkError> {
        check_shape(
            "the tapped context",
            taps,
            &[1, -1, self.config.context_width()],
        )?;
        Ok(self.hidden_norm.forward(&self.fc.forward(taps)?)?)
    }

    /// Appends tapped target hidden states `[1, L, taps * H]` (the rows after
    /// the ones already held) to `ctx` as keys and values of every layer.
    pub fn extend_context(&self, ctx: &mut Context, taps: &Array) -> Result<(), DSparkError> {
        let x = self.project_context(taps)?;
        let rows = taps.shape()[1] as usize;
        if rows == 0 {
            return Ok(());
        }
        let c = &self.config;
        let offset = ctx.len();
        let mut fresh = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let a = &layer.attn;
            let k =
                a.k.forward(&x)?
                    .reshape(&[1, rows as i32, c.kv_heads, c.head_dim])?;
            let keys = self.rope.apply(
                &a.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?,
                offset,
            )?;
            let values = mlx_rs::fast::rms_norm(&k, None, c.eps)?.transpose_axes(&[0, 2, 1, 3])?;
            fresh.push((keys, values));
        }
        ctx.append(fresh, rows)?;
        Ok(())
    }

    /// One block forward: `[anchor, mask x (B - 1)]` at positions
    /// `ctx.len() ..`, attending over the context and the whole block;
    /// returns the final-normed hidden states `[1, B, H]`. `ctx` is not changed.
    pub fn block_hidden(&self, ctx: &Context, anchor: u32) -> Result<Array, DSparkError> {
        let c = &self.config;
        let b = c.block_size as i32;
        let mut ids = vec![c.mask_token_id; c.block_size];
        ids[0] = anchor;
        let ids = Array::from_slice(&ids, &[1, b]);
        let mut h = self
            .embed
            .forward(&ids)?
            .multiply(Array::from_f32(self.embed_scale))?;
        for (i, layer) in self.layers.iter().enumerate() {
            let residual = h.clone();
            let x = layer.input_norm.forward(&h)?;
            let a = self.attention(&layer.attn, &x, ctx.layer(i), ctx.len())?;
            let x = layer.post_attention_norm.forward(&a)?;
            let h1 = residual.add(&x)?;
            let x = layer.pre_feedforward_norm.forward(&h1)?;
            let x = layer.mlp.forward(&x)?;
            let x = layer.post_feedforward_norm.forward(&x)?;
            h = h1.add(&x)?.multiply(&layer.scalar)?;
        }
        Ok(self.norm.forward(&h)?)
    }

    fn attention(
        &self,
        a: &Attention,
        x: &Array,
        ctx: Option<&(Array, Array)>,
        offset: usize,
    ) -> Result<Array, DSparkError> {
        let c = &self.config;
        let l = x.shape()[1];
        let queries = a
            .q_norm
            .forward(&a.q.forward(x)?.reshape(&[1, l, c.heads, c.head_dim])?)?
            .transpose_axes(&[0, 2, 1, 3])?;
        let queries = self.rope.apply(&queries, offset)?;
        let k = a.k.forward(x)?.reshape(&[1, l, c.kv_heads, c.head_dim])?;
        let keys = self.rope.apply(
            &a.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?,
            offset,
        )?;
        let values = mlx_rs::fast::rms_norm(&k, None, c.eps)?.transpose_axes(&[0, 2, 1, 3])?;
        let (keys, values) = match ctx {
            Some((k0, v0)) => (
                concatenate(&[k0, &keys], 2)?,
                concatenate(&[v0, &values], 2)?,
            ),
            None => (keys, values),
        };
        let out =
            mlx_rs::fast::scaled_dot_product_attention(&queries, &keys, &values, 1.0, None, None)?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, l, -1])?;
        Ok(a.o.forward(&out)?)
    }

    /// Logits `[.., V]` of final-normed hidden states: `lm_head`, then the
    /// softcap `tanh(x / s) * s` when configured.
    pub fn logits(&self, hidden: &Array) -> Result<Array, DSparkError> {
        let logits = self.lm_head.forward(hidden)?;
        Ok(match self.config.softcap {
            Some(s) => softcap(&logits, s)?,
            None => logits,
        })
    }

    /// The whole draft of one round: the block forward, then `block_size`
    /// tokens drawn one by one with `sampler` from
    /// the Markov-corrected logits, then the confidences. The token chain is
    /// built lazily (each token indexes the Markov table as an array) and
    /// evaluated once, with the confidences.
    pub fn propose(
        &self,
        ctx: &Context,
        anchor: u32,
        sampler: &mut dyn Sampler,
    ) -> Result<BlockProposal, DSparkError> {
        let b = self.config.block_size;
        let hidden = self.block_hidden(ctx, anchor)?;
        let base = self.logits(&hidden)?;
        let anchor = Array::from_slice(&[anchor], &[1]);
        let mut chain = Vec::with_capacity(b);
        let mut logprobs = Vec::with_capacity(b);
        let mut prev = anchor.clone();
        for j in 0..b {
            let mut step = base.index((.., j as i32, ..));
            if let Some(m) = &self.markov {
                step = step.add(m.w2.forward(&m.w1.forward(&prev)?)?)?;
            }
            let lp = mlx_ext::softmax::log_softmax(&step)?;
            let token = sampler
                .sample(&lp)?
                .as_dtype(Dtype::Uint32)?
                .reshape(&[1])?;
            chain.push(token.clone());
            logprobs.push(lp);
            prev = token;
        }
        let drawn = concatenate(&chain, 0)?;
        let confidences = match &self.confidence {
            Some(proj) => Some(self.confidences(proj, &hidden, &anchor, &chain)?),
            None => None,
        };
        match &confidences {
            Some(c) => mlx_rs::transforms::eval([&drawn, c])?,
            None => drawn.eval()?,
        }
        let tokens = drawn.as_slice::<u32>().to_vec();
        if tokens.len() != b {
            return Err(DrafterError::Shape {
                what: "the sampled tokens".into(),
                found: drawn.shape().to_vec(),
                expected: format!("[{b}]"),
            }
            .into());
        }
        let confidences = confidences.map(|c| c.as_slice::<f32>().to_vec());
        Ok(BlockProposal {
            tokens,
            confidences,
            logprobs,
        })
    }

    /// `sigmoid(proj([h_j ; markov_w1[prev_j]]))` over the block, `prev` =
    /// the anchor, then the drawn tokens but the last; `[1, B, 1]`, lazy.
    fn confidences(
        &self,
        proj: &Linear,
        hidden: &Array,
        anchor: &Array,
        chain: &[Array],
    ) -> Result<Array, DSparkError> {
        let features = match (&self.markov, self.config.confidence_with_markov) {
            (Some(m), true) => {
                let mut prev: Vec<&Array> = Vec::with_capacity(chain.len());
                prev.push(anchor);
                prev.extend(&chain[..chain.len().saturating_sub(1)]);
                let prev = concatenate(&prev, 0)?.reshape(&[1, chain.len() as i32])?;
                concatenate(&[hidden, &m.w1.forward(&prev)?], -1)?
            }
            _ => hidden.clone(),
        };
        Ok(sigmoid(&proj.forward(&features)?)?.as_dtype(Dtype::Float32)?)
    }
}
