//! The assistant drafter: `pre_projection` of (scaled target embedding,
//! hidden), the Q-only blocks over the donors, the final norm, the output
//! head and `post_projection` back to the target's hidden space. One
//! [`AssistantModel::step`] is one draft token, as optiq's
//! `GemmaAssistantDrafter.forward`.

use std::path::Path;

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_models::DtypePolicy;
use spec_runtime::config::Quantization;
use spec_runtime::layers::{Embedding, Linear, RmsNorm};
use spec_runtime::weights::Weights;

use crate::block::{Block, DonorKv};
use crate::config::{AssistantConfig, LayerKind};
use crate::head::Head;
use crate::AssistantError;

/// The donors one step reads: the target's last sliding and last full cache
/// that own keys and values, each time-ordered.
#[derive(Debug, Clone, Default)]
pub struct DonorPair {
    /// For sliding blocks.
    pub sliding: Option<DonorKv>,
    /// For full blocks.
    pub full: Option<DonorKv>,
}

impl DonorPair {
    fn of(&self, kind: LayerKind) -> Result<&DonorKv, AssistantError> {
        let donor = match kind {
            LayerKind::Sliding => self.sliding.as_ref(),
            LayerKind::Full => self.full.as_ref(),
        };
        donor.filter(|d| !d.is_empty()).ok_or_else(|| {
            AssistantError::Donors(format!("no {kind:?} donor keys (empty target cache?)"))
        })
    }
}

/// What one drafter step gives.
#[derive(Debug)]
pub struct StepOutput {
    /// Draft logits over the vocabulary, `[V]` (-1e30 outside the centroid
    /// head's candidates).
    pub logits: Array,
    /// `post_projection` of the normed hidden, `[1, 1, backbone]`: the
    /// hidden the next step chains on.
    pub next_hidden: Array,
}

/// A loaded Gemma-4 assistant drafter.
#[derive(Debug)]
pub struct AssistantModel {
    config: AssistantConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    pre_projection: Linear,
    post_projection: Linear,
    head: Head,
    weights_bytes: usize,
}

impl AssistantModel {
    /// Loads a `gemma4_assistant` / `gemma4_unified_assistant` directory.
    /// Every tensor is checked for presence and shape, and none may be left
    /// over.
    pub fn load(dir: &Path, policy: DtypePolicy) -> Result<Self, AssistantError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| AssistantError::Io {
            path: path.clone(),
            source,
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| AssistantError::ConfigJson {
                path: path.clone(),
                source,
            })?;
        let config = AssistantConfig::parse(&value, &path)?;
        let quant = Quantization::of_config(&value, &path)?;
        let weights = Weights::from_dir(dir)?;
        Self::build(config, &quant, weights, policy)
    }

    /// Builds the drafter from a validated config and a weight store.
    pub fn build(
        config: AssistantConfig,
        quant: &Quantization,
        w: Weights,
        policy: DtypePolicy,
    ) -> Result<Self, AssistantError> {
        let c = &config;
        let vb = w.view(quant, policy);
        let embed = Embedding::load(&vb.pp("model.embed_tokens"), c.vocab, c.hidden)?;
        let blocks = (0..c.layers.len())
            .map(|i| Block::load(&vb.pp("model.layers").pp(i), c, i))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = RmsNorm::load(&vb.pp("model.norm"), c.hidden, c.eps)?;
        let (hidden, backbone) = (c.hidden, c.backbone_hidden);
        let pre_projection = Linear::load(&vb.pp("pre_projection"), 2 * backbone, hidden, false)?;
        let post_projection = Linear::load(&vb.pp("post_projection"), hidden, backbone, false)?;
        let head = Head::load(&vb, c)?;
        w.finish()?;
        let weights_bytes = embed.nbytes()
            + blocks.iter().map(Block::nbytes).sum::<usize>()
            + norm.nbytes()
            + pre_projection.nbytes()
            + post_projection.nbytes()
            + head.nbytes();
        tracing::debug!(model_type = %c.model_type, layers = c.layers.len(), head = ?c.head, weights_bytes, "loaded the Gemma-4 assistant");
        Ok(Self {
            config,
            embed,
            blocks,
            norm,
            pre_projection,
            post_projection,
            head,
            weights_bytes,
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &AssistantConfig {
        &self.config
    }

    /// Bytes of its weights.
    pub fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    /// One draft step. `token_embedding` is the target's scaled embedding
    /// of the input token and `hidden` the hidden to chain on (both
    /// `[1, 1, backbone]`); every block's query sits at `position`.
    pub fn step(
        &self,
        token_embedding: &Array,
        hidden: &Array,
        donors: &DonorPair,
        position: usize,
    ) -> Result<StepOutput, AssistantError> {
        let want = [1, 1, self.config.backbone_hidden];
        for (name, a) in [("token embedding", token_embedding), ("hidden", hidden)] {
            if a.shape() != want {
                return Err(AssistantError::Input(format!(
                    "{name} has shape {:?}, expected {want:?}",
                    a.shape()
                )));
            }
        }
        let x = concatenate(&[token_embedding, hidden], -1)?;
        let mut h = self.pre_projection.forward(&x)?;
        for block in &self.blocks {
            h = block.forward(&h, donors.of(block.kind())?, position)?;
        }
        let h = self.norm.forward(&h)?;
        let logits = self
            .head
            .logits(&h, &self.embed)?
            .reshape(&[self.config.vocab])?;
        let next_hidden = self.post_projection.forward(&h)?;
        Ok(StepOutput {
            logits,
            next_hidden,
        })
    }
}
