//! An EAGLE-3 head: `fc` fuses the target's low, mid and high features
//! (each optionally normed, `fc_norm`) into the head's width; its one
//! decoder layer takes `[input_layernorm(embed(token)); hidden_norm(h)]`
//! (twice the width) into attention over its own key/value cache, adds the
//! residual `h`, then the MLP; the output `h'` (before the final norm) is
//! the next step's `h`; `lm_head(norm(h'))` scores the reduced draft
//! vocabulary, whose ids map to the target's through `d2t` (target id =
//! draft id + `d2t[draft id]`). The embedding is the head's own when the
//! checkpoint carries `embed_tokens`, else the target's.

use std::path::Path;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, full};
use mlx_rs::{Array, Dtype};
use spec_core::LayerCache;
use spec_runtime::cache::KvCache;
use spec_runtime::layers::{Activation, Embedding, GatedMlp, Linear, RmsNorm};
use spec_runtime::rope::Rope;
use spec_runtime::sdpa::{self, Mask};
use spec_runtime::weights::Weights;
use spec_runtime::{LoadOptions, ModelError};

use crate::config::Eagle3Config;

/// The head's per-request cache: one key/value row per position.
pub type HeadCache = KvCache;

/// A loaded EAGLE-3 head.
#[derive(Debug)]
pub struct Eagle3Model {
    config: Eagle3Config,
    fc: Linear,
    fc_norms: Option<[RmsNorm; 3]>,
    embed: Option<Embedding>,
    input_norm: RmsNorm,
    hidden_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    post_norm: RmsNorm,
    mlp: GatedMlp,
    norm: RmsNorm,
    lm_head: Linear,
    /// For each target id, its draft id, or `draft_vocab` (a column of
    /// `-inf`) for target ids the head cannot propose: `[vocab]` int32.
    gather: Array,
    rope: Rope,
    scale: f32,
}

impl Eagle3Model {
    /// Loads a head directory (`config.json`, safetensors).
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, ModelError> {
        let config = Eagle3Config::read(dir)?;
        let c = &config;
        let w = Weights::from_dir(dir)?;
        let vb = w.view(&c.quantization, options.dtype);
        let (h, t, eps) = (c.hidden, c.target_hidden, c.eps);
        let (qd, kd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let m = vb.pp("midlayer");
        let a = m.pp("self_attn");
        let fc_norms = if c.fc_norm {
            let n = |i: usize| RmsNorm::load(&vb.pp("fc_norm").pp(i), t, eps);
            Some([n(0)?, n(1)?, n(2)?])
        } else {
            None
        };
        let embed = if w.contains("embed_tokens.weight") {
            Some(Embedding::load(&vb.pp("embed_tokens"), c.vocab, h)?)
        } else {
            None
        };
        let gather = draft_map(&w, c, dir)?;
        let config_path = dir.join("config.json");
        let rope = Rope::new(
            c.head_dim,
            c.rope_theta,
            false,
            c.rope_scaling.as_ref(),
            &config_path,
        )?;
        let model = Self {
            fc: Linear::load(&vb.pp("fc"), 3 * t, h, false)?,
            fc_norms,
            embed,
            input_norm: RmsNorm::load(&m.pp("input_layernorm"), h, eps)?,
            hidden_norm: RmsNorm::load(&m.pp("hidden_norm"), h, eps)?,
            q: Linear::load(&a.pp("q_proj"), 2 * h, qd, false)?,
            k: Linear::load(&a.pp("k_proj"), 2 * h, kd, false)?,
            v: Linear::load(&a.pp("v_proj"), 2 * h, kd, false)?,
            o: Linear::load(&a.pp("o_proj"), qd, h, false)?,
            post_norm: RmsNorm::load(&m.pp("post_attention_layernorm"), h, eps)?,
            mlp: GatedMlp::load(&m.pp("mlp"), h, c.intermediate, false, Activation::Silu)?,
            norm: RmsNorm::load(&vb.pp("norm"), h, eps)?,
            lm_head: Linear::load(&vb.pp("lm_head"), h, c.draft_vocab, false)?,
            gather,
            rope,
            scale: f64::from(c.head_dim).powf(-0.5) as f32,
            config,
        };
        w.finish()?;
        Ok(model)
    }

    /// The validated configuration.
    pub fn config(&self) -> &Eagle3Config {
        &self.config
    }

    /// Whether the head carries its own embedding (else it uses the
    /// target's).
    pub fn has_embedding(&self) -> bool {
        self.embed.is_some()
    }

    /// The fused target features `[1, L, 3 * target_hidden]` (low, mid,
    /// high) projected to the head's width.
    pub fn project(&self, features: &Array) -> Result<Array, ModelError> {
        let features = match &self.fc_norms {
            None => features.clone(),
            Some(norms) => {
                let parts = features.split_equal(3, -1)?;
                let normed = norms
                    .iter()
                    .zip(&parts)
                    .map(|(n, p)| n.forward(p))
                    .collect::<Result<Vec<_>, _>>()?;
                concatenate(&normed, -1)?
            }
        };
        self.fc.forward(&features)
    }

    /// The embedding of `tokens` (`[1, L]`): the head's own, or `target`'s.
    pub fn embed(
        &self,
        tokens: &Array,
        target: &dyn spec_core::Target,
    ) -> Result<Array, spec_core::SpecError> {
        match &self.embed {
            Some(e) => Ok(e.forward(tokens)?),
            None => target.embed(tokens),
        }
    }

    /// The decoder layer over `embedded` tokens (`[1, L, hidden]`) each
    /// paired with its `hidden` (`[1, L, hidden]`: a projected target
    /// feature or the head's previous output), appending `L` rows to
    /// `cache`: the layer's output before the final norm.
    pub fn layer(
        &self,
        embedded: &Array,
        hidden: &Array,
        cache: &mut HeadCache,
    ) -> Result<Array, ModelError> {
        let (b, l) = (hidden.shape()[0], hidden.shape()[1]);
        let x = concatenate(
            &[
                self.input_norm.forward(embedded)?,
                self.hidden_norm.forward(hidden)?,
            ],
            -1,
        )?;
        let heads_first = |a: Array, n: i32| -> Result<Array, ModelError> {
            Ok(a.reshape(&[b, l, n, -1])?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let c = &self.config;
        let q = heads_first(self.q.forward(&x)?, c.heads)?;
        let k = heads_first(self.k.forward(&x)?, c.kv_heads)?;
        let v = heads_first(self.v.forward(&x)?, c.kv_heads)?;
        let offset = cache.offset();
        let q = self.rope.apply(&q, offset)?;
        let k = self.rope.apply(&k, offset)?;
        let (k, v) = cache.update_and_fetch(&k, &v)?;
        let mask = if l > 1 { Mask::Causal } else { Mask::None };
        let attended = sdpa::attention(&q, &k, &v, self.scale, mask)?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, l, -1])?;
        let h = hidden.add(&self.o.forward(&attended)?)?;
        Ok(h.add(&self.mlp.forward(&self.post_norm.forward(&h)?)?)?)
    }

    /// The draft vocabulary's logits of the layer's output `out`.
    pub fn draft_logits(&self, out: &Array) -> Result<Array, ModelError> {
        if self.config.norm_output {
            self.lm_head.forward(&self.norm.forward(out)?)
        } else {
            self.lm_head.forward(out)
        }
    }

    /// Draft logits `[.., draft_vocab]` laid over the target's vocabulary
    /// (`-inf` where the head proposes nothing).
    pub fn target_logits(&self, draft: &Array) -> Result<Array, ModelError> {
        let mut shape = draft.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = 1;
        }
        let never =
            full::<f32>(&shape, Array::from_f32(f32::NEG_INFINITY))?.as_dtype(draft.dtype())?;
        let padded = concatenate(&[draft.clone(), never], -1)?;
        Ok(padded.take_axis(&self.gather, -1)?)
    }
}

/// Reads `d2t` (and checks `t2d`): for each target id, the draft id that
/// proposes it, or `draft_vocab`.
fn draft_map(w: &Weights, c: &Eagle3Config, dir: &Path) -> Result<Array, ModelError> {
    let bad = |message: String| ModelError::WeightsFile {
        path: dir.to_path_buf(),
        message,
    };
    let d2t = w.take("d2t")?;
    if d2t.shape() != [c.draft_vocab] {
        return Err(bad(format!(
            "`d2t` has shape {:?}, expected [{}] (draft_vocab_size)",
            d2t.shape(),
            c.draft_vocab
        )));
    }
    let d2t = d2t.as_dtype(Dtype::Int64)?;
    d2t.eval()?;
    let mut gather = vec![c.draft_vocab; c.vocab as usize];
    for (i, &offset) in d2t.as_slice::<i64>().iter().enumerate() {
        let target = i as i64 + offset;
        let slot = usize::try_from(target)
            .ok()
            .filter(|&t| t < c.vocab as usize)
            .ok_or_else(|| {
                bad(format!(
                    "`d2t` maps draft id {i} to target id {target}, outside the vocabulary of {}",
                    c.vocab
                ))
            })?;
        if gather[slot] != c.draft_vocab {
            return Err(bad(format!(
                "`d2t` maps two draft ids ({} and {i}) to target id {target}",
                gather[slot]
            )));
        }
        gather[slot] = i as i32;
    }
    if w.contains("t2d") {
        let t2d = w.take("t2d")?;
        if t2d.shape() != [c.vocab] {
            return Err(bad(format!(
                "`t2d` has shape {:?}, expected [{}] (vocab_size)",
                t2d.shape(),
                c.vocab
            )));
        }
    }
    Ok(Array::from_slice(&gather, &[c.vocab]))
}

/// The last position of `x` (`[1, L, D]`) as `[1, 1, D]`.
pub(crate) fn last(x: &Array) -> Array {
    x.index((.., -1.., ..))
}
