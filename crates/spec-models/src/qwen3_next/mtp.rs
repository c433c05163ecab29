//! The MTP head of Qwen3-Next and Qwen3.5 checkpoints (`mtp.*`, which
//! mlx-lm drops at load): the normed embedding of a token and the normed
//! post-norm hidden state that predicted it, joined (`[embedding; hidden]`)
//! and projected back to the hidden width (`fc`), one gated full-attention
//! decoder layer (dense MLP or expert block, as its tensors say) over its
//! own key/value cache, and a final norm; its logits come from the
//! target's head. The layout as vLLM's `qwen3_next_mtp` / `qwen3_5_mtp`
//! proposers load it; the `qwen3-native-mtp` provider drafts with it.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::LayerCache;

use super::attention::GatedAttention;
use super::config::Config;
use super::sanitize::{MTP, MTP_LAYER};
use crate::layers::{Linear, RmsNorm};
use crate::rope::Rope;
use crate::sparse_moe::FeedForward;
use crate::weights::{Weights, WeightsView};
use crate::ModelError;

/// The tensor whose presence says a checkpoint carries an MTP head.
const MARKER: &str = "mtp.fc.weight";

#[derive(Debug)]
pub(super) struct MtpHead {
    fc: Linear,
    norm_embedding: RmsNorm,
    norm_hidden: RmsNorm,
    input_norm: RmsNorm,
    attention: GatedAttention,
    post_norm: RmsNorm,
    mlp: FeedForward,
    norm: RmsNorm,
}

impl MtpHead {
    /// Whether `w` holds an MTP head.
    pub fn present(w: &Weights) -> bool {
        w.contains(MARKER)
    }

    /// Loads the head (`vb` is the root view). One MTP layer only: a
    /// second (`mtp.layers.1.*`) is refused by name.
    pub fn load(w: &Weights, vb: &WeightsView<'_>, c: &Config) -> Result<Self, ModelError> {
        let second = format!("{MTP}.layers.1.input_layernorm.weight");
        if w.contains(&second) {
            return Err(ModelError::WeightsFile {
                path: std::path::PathBuf::from(second),
                message: "the MTP head has more than one layer; one is supported".to_owned(),
            });
        }
        let h = c.hidden;
        let p = vb.pp(MTP);
        let l = vb.pp(MTP_LAYER);
        let mlp = l.pp("mlp");
        let mlp = if mlp.contains("gate.weight") {
            let m = c.moe.ok_or_else(|| ModelError::WeightsFile {
                path: std::path::PathBuf::from(mlp.name("gate.weight")),
                message: "the MTP layer has an expert block but the config has no experts"
                    .to_owned(),
            })?;
            FeedForward::load(&mlp, Some(m), h, c.intermediate, false, None)?
        } else {
            FeedForward::load(&mlp, None, h, c.intermediate, false, None)?
        };
        Ok(Self {
            fc: Linear::load(&p.pp("fc"), 2 * h, h, false)?,
            norm_embedding: RmsNorm::load(&p.pp("pre_fc_norm_embedding"), h, c.eps)?,
            norm_hidden: RmsNorm::load(&p.pp("pre_fc_norm_hidden"), h, c.eps)?,
            input_norm: RmsNorm::load(&l.pp("input_layernorm"), h, c.eps)?,
            attention: GatedAttention::load(&l.pp("self_attn"), c)?,
            post_norm: RmsNorm::load(&l.pp("post_attention_layernorm"), h, c.eps)?,
            mlp,
            norm: RmsNorm::load(&p.pp("norm"), h, c.eps)?,
        })
    }

    /// Whether a forward of `tokens` rows takes mlx-lm's sorted expert
    /// form (an expert layer past its sorting threshold): its rows' bits
    /// then depend on the chunk.
    pub fn sorts(&self, tokens: usize) -> bool {
        self.mlp.sorts(tokens)
    }

    pub fn nbytes(&self) -> usize {
        self.fc.nbytes()
            + self.norm_embedding.nbytes()
            + self.norm_hidden.nbytes()
            + self.input_norm.nbytes()
            + self.attention.nbytes()
            + self.post_norm.nbytes()
            + self.mlp.nbytes()
            + self.norm.nbytes()
    }

    /// The head over `embedded` tokens (`[1, L, hidden]`, the target's
    /// embedding) each paired with the post-norm hidden state that
    /// predicted it (`[1, L, hidden]`), appending `L` rows to `cache` at
    /// its offset: the head's normed output `[1, L, hidden]`.
    pub fn forward(
        &self,
        embedded: &Array,
        hidden: &Array,
        rope: &Rope,
        cache: &mut dyn LayerCache,
    ) -> Result<Array, ModelError> {
        let e = self.norm_embedding.forward(embedded)?;
        let h = self.norm_hidden.forward(hidden)?;
        let x = self.fc.forward(&concatenate(&[e, h], -1)?)?;
        let r = self
            .attention
            .forward_alone(&self.input_norm.forward(&x)?, rope, cache)?;
        let x = x.add(&r)?;
        let r = self.mlp.forward_alone(&self.post_norm.forward(&x)?)?;
        self.norm.forward(&x.add(&r)?)
    }
}
