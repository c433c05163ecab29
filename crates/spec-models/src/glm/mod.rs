//! `glm_moe_dsa` (GLM-5.x) as mlx-lm 0.32.2 defines it (`glm_moe_dsa.py` over
//! `deepseek_v32.py`): multi-head latent attention with a compressed cache
//! and interleaved partial RoPE, the DSA indexer (sparse attention past
//! `index_topk` keys), dense MLPs in the first `first_k_dense_replace` layers
//! and a routed mixture of experts after them. Weights are read in mlx-lm's
//! layout (stacked `switch_mlp` experts, `embed_q` / `unembed_out`), float or
//! affine-quantized, or, float only, in Hugging Face's (`layout`).
//!
//! Unlike mlx-lm, the loader keeps the multi-token-prediction row that GLM
//! checkpoints carry at layer index `num_hidden_layers` (`enorm`, `hnorm`,
//! `eh_proj`, a decoder layer run with dense attention, `shared_head.norm`):
//! the `glm52-native-mtp` draft provider runs it through `mtp_forward` /
//! `mtp_logits`.

mod attention;
mod cache;
mod config;
mod layout;
mod moe;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use mlx_rs::ops::concatenate;
use mlx_rs::{Array, Dtype};
use spec_core::{CacheSet, LayerCache, SpecError, Target, TargetInfo, TargetOutput};

use self::attention::{Attention, LayerCaches};
pub use self::cache::{IndexerCache, MlaCache, MlaRole};
pub use self::config::{Config, MoeConfig};
use self::config::{ConfigFile, Ropes};
use self::moe::{mlp, FeedForward, Moe};
use crate::config::read_config;
use crate::layers::{concat_taps, Embedding, Linear, RmsNorm};
use crate::mask::causal_mask;
use crate::weights::{Weights, WeightsView};
use crate::{LoadOptions, ModelError};

/// What a loaded GLM checkpoint offers besides the target forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The checkpoint holds the MTP row (layer `num_hidden_layers`).
    pub mtp_present: bool,
    /// The MTP row was loaded (present and not disabled at load).
    pub mtp_enabled: bool,
    /// `num_nextn_predict_layers` of the config.
    pub nextn_layers: usize,
}

/// GLM-specific load options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlmOptions {
    /// Load the MTP row when the checkpoint has one (false drops it, saving
    /// its memory; the native MTP provider then refuses the model).
    pub load_mtp: bool,
}

impl Default for GlmOptions {
    fn default() -> Self {
        Self { load_mtp: true }
    }
}

#[derive(Debug)]
struct DecoderLayer {
    attn: Attention,
    ffn: FeedForward,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
}

impl DecoderLayer {
    /// Loads layer `index`, which `vb` reads (`model.layers.{index}`).
    fn load(
        vb: &WeightsView<'_>,
        index: usize,
        c: &Config,
        with_indexer: bool,
    ) -> Result<Self, ModelError> {
        let ffn = match &c.moe {
            Some(m) if c.is_moe_layer(index) => FeedForward::Moe(Moe::load(&vb.pp("mlp"), c, m)?),
            _ => FeedForward::Dense(mlp(&vb.pp("mlp"), c.hidden, c.intermediate)?),
        };
        Ok(Self {
            attn: Attention::load(&vb.pp("self_attn"), c, with_indexer)?,
            ffn,
            input_norm: RmsNorm::load(&vb.pp("input_layernorm"), c.hidden, c.eps)?,
            post_norm: RmsNorm::load(&vb.pp("post_attention_layernorm"), c.hidden, c.eps)?,
        })
    }

    fn nbytes(&self) -> usize {
        self.attn.nbytes() + self.ffn.nbytes() + self.input_norm.nbytes() + self.post_norm.nbytes()
    }

    /// `rows_alone`: every row computed as a single query would be (see
    /// `Attention::forward`; the MoE then never regroups rows by expert).
    fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        ropes: &Ropes,
        caches: &mut LayerCaches<'_>,
        rows_alone: bool,
    ) -> Result<Array, ModelError> {
        let r = self.attn.forward(
            &self.input_norm.forward(x)?,
            mask,
            ropes,
            caches,
            rows_alone,
        )?;
        let h = x.add(&r)?;
        let r = self.ffn.forward(&self.post_norm.forward(&h)?, rows_alone)?;
        Ok(h.add(&r)?)
    }
}

/// The multi-token-prediction row.
#[derive(Debug)]
struct MtpRow {
    enorm: RmsNorm,
    hnorm: RmsNorm,
    eh_proj: Linear,
    layer: DecoderLayer,
    shared_norm: RmsNorm,
}

impl MtpRow {
    fn nbytes(&self) -> usize {
        self.enorm.nbytes()
            + self.hnorm.nbytes()
            + self.eh_proj.nbytes()
            + self.layer.nbytes()
            + self.shared_norm.nbytes()
    }
}

/// A loaded `glm_moe_dsa` model.
#[derive(Debug)]
pub struct Model {
    config: Config,
    info: TargetInfo,
    ropes: Ropes,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    head: Linear,
    mtp: Vec<MtpRow>,
    capabilities: Capabilities,
}

/// Tensors that mark an MTP row as present.
fn mtp_marker(row: usize) -> String {
    format!("model.layers.{row}.enorm.weight")
}

impl Model {
    /// Loads a `glm_moe_dsa` directory (mlx-lm layout), MTP row included.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, ModelError> {
        Self::load_with(dir, options, GlmOptions::default())
    }

    /// Loads with GLM-specific options.
    pub fn load_with(
        dir: &Path,
        options: &LoadOptions,
        glm: GlmOptions,
    ) -> Result<Self, ModelError> {
        let (file, path): (ConfigFile, PathBuf) = read_config(dir)?;
        let (config, ropes) = config::parse(file, &path)?;
        let w = Weights::from_dir(dir)?;
        let c = &config;
        let vb = w.view(&c.quantization, options.dtype);
        let embed = Embedding::load(&vb.pp("model.embed_tokens"), c.vocab, c.hidden)?;
        let total = c.layers + c.nextn_layers;
        let rows = vb.pp("model.layers");
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let _span = tracing::debug_span!("load_layer", layer = i).entered();
            let p = rows.pp(i);
            layout::to_mlx_layout(&p, c)?;
            layers.push(DecoderLayer::load(&p, i, c, true)?);
            if let Some(progress) = &options.progress {
                progress(i + 1, total);
            }
        }
        let norm = RmsNorm::load(&vb.pp("model.norm"), c.hidden, c.eps)?;
        let head = Linear::load(&vb.pp("lm_head"), c.hidden, c.vocab, false)?;

        if c.nextn_layers == 0 && w.contains(&mtp_marker(c.layers)) {
            return Err(ModelError::Config {
                path,
                message: format!("the checkpoint holds an MTP row (model.layers.{}.*) but num_nextn_predict_layers is 0 or missing", c.layers),
            });
        }
        let mtp_present = c.nextn_layers > 0 && w.contains(&mtp_marker(c.layers));
        let mut mtp = Vec::new();
        if mtp_present && glm.load_mtp {
            for row in c.layers..total {
                let p = rows.pp(row);
                // The MTP row attends densely (no DSA), and its logits use
                // the target's head: its own indexer, embedding copy and
                // head copy (present in some exports) are unused.
                let unused = [
                    p.name("self_attn.indexer."),
                    p.name("embed_tokens."),
                    p.name("shared_head.head."),
                ];
                w.discard_where(|name| unused.iter().any(|u| name.starts_with(u.as_str())));
                layout::to_mlx_layout(&p, c)?;
                let (h, eps) = (c.hidden, c.eps);
                mtp.push(MtpRow {
                    enorm: RmsNorm::load(&p.pp("enorm"), h, eps)?,
                    hnorm: RmsNorm::load(&p.pp("hnorm"), h, eps)?,
                    eh_proj: Linear::load(&p.pp("eh_proj"), 2 * h, h, false)?,
                    layer: DecoderLayer::load(&p, row, c, false)?,
                    shared_norm: RmsNorm::load(&p.pp("shared_head.norm"), h, eps)?,
                });
                if let Some(progress) = &options.progress {
                    progress(row + 1, total);
                }
            }
        } else if mtp_present {
            let first = c.layers;
            w.discard_where(|name| {
                name.strip_prefix("model.layers.")
                    .and_then(|rest| rest.split('.').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n >= first)
            });
        }
        w.finish()?;
        let capabilities = Capabilities {
            mtp_present,
            mtp_enabled: !mtp.is_empty(),
            nextn_layers: c.nextn_layers,
        };
        tracing::debug!(?capabilities, "glm_moe_dsa loaded");
        let info = TargetInfo {
            model_type: c.model_type.clone(),
            vocab_size: c.vocab as usize,
            hidden_size: c.hidden as usize,
            num_layers: c.layers,
            context_length: Some(c.context_length),
        };
        Ok(Self {
            config,
            info,
            ropes,
            embed,
            layers,
            norm,
            head,
            mtp,
            capabilities,
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// MTP presence and state.
    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// Bytes of the MTP row's own weights (it shares the embedding and head).
    pub fn mtp_weights_bytes(&self) -> usize {
        self.mtp.iter().map(MtpRow::nbytes).sum()
    }

    /// An empty cache for the MTP row.
    pub fn new_mtp_cache(&self) -> MlaCache {
        MlaCache::new(MlaRole::Mtp, self.config.kv_lora_rank, self.config.qk_rope)
    }

    fn mtp_row(&self) -> Result<&MtpRow, ModelError> {
        self.mtp.first().ok_or_else(|| {
            ModelError::Spec(SpecError::Invalid(
                "this GLM model has no loaded MTP row".into(),
            ))
        })
    }

    /// One pass of the MTP row over `L` (token, hidden) pairs: `tokens`
    /// `[1, L]` are the next tokens, `hidden` `[1, L, H]` the hidden states
    /// that predicted them. Appends `L` rows to `cache`; returns the row's
    /// output `[1, L, H]` (before `shared_head.norm`: the next step's hidden).
    pub fn mtp_forward(
        &self,
        tokens: &Array,
        hidden: &Array,
        cache: &mut MlaCache,
    ) -> Result<Array, ModelError> {
        let row = self.mtp_row()?;
        if cache.role() != MlaRole::Mtp
            || cache.geometry() != (self.config.kv_lora_rank, self.config.qk_rope)
        {
            return Err(ModelError::Spec(SpecError::Invalid(format!(
                "not an MTP cache of this model: {:?} {:?}",
                cache.role(),
                cache.geometry()
            ))));
        }
        let l = tokens.shape().get(1).copied().unwrap_or(0);
        if tokens.ndim() != 2 || hidden.shape() != [1, l, self.config.hidden] || l == 0 {
            return Err(ModelError::Spec(SpecError::Invalid(format!(
                "MTP pairs need tokens [1, L] and hidden [1, L, {}], got {:?} and {:?}",
                self.config.hidden,
                tokens.shape(),
                hidden.shape()
            ))));
        }
        let e = row.enorm.forward(&self.embed.forward(tokens)?)?;
        let h = row.hnorm.forward(hidden)?;
        let x = row.eh_proj.forward(&concatenate(&[e, h], -1)?)?;
        let mask = causal_mask(l as usize, cache.offset())?;
        row.layer.forward(
            &x,
            mask.as_ref(),
            &self.ropes,
            &mut LayerCaches::Mtp(cache),
            false,
        )
    }

    /// Logits of MTP outputs: `shared_head.norm`, then the target's head.
    pub fn mtp_logits(&self, out: &Array) -> Result<Array, ModelError> {
        self.head
            .forward(&self.mtp_row()?.shared_norm.forward(out)?)
    }

    /// Bytes of all weights, as held in memory.
    pub fn weights_bytes(&self) -> usize {
        self.layers.iter().map(DecoderLayer::nbytes).sum::<usize>()
            + self.embed.nbytes()
            + self.norm.nbytes()
            + self.head.nbytes()
            + self.mtp_weights_bytes()
    }
}

impl Model {
    /// The target forward; `rows_alone` as in `DecoderLayer::forward`.
    fn run(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
        rows_alone: bool,
    ) -> Result<TargetOutput, SpecError> {
        if tokens.ndim() != 2 {
            return Err(SpecError::Invalid(format!(
                "tokens must be [B, L], got {:?}",
                tokens.shape()
            )));
        }
        if caches.len() != 2 * self.layers.len() {
            return Err(SpecError::Invalid(format!(
                "{} caches for {} layers (two per layer)",
                caches.len(),
                self.layers.len()
            )));
        }
        if let Some(bad) = taps.iter().find(|&&t| t >= self.layers.len()) {
            return Err(SpecError::Invalid(format!(
                "tap layer {bad} out of range ({} layers)",
                self.layers.len()
            )));
        }
        let ids = if tokens.dtype() == Dtype::Uint32 || tokens.dtype() == Dtype::Int32 {
            tokens.clone()
        } else {
            tokens.as_dtype(Dtype::Int32)?
        };
        let mut h = self.embed.forward(&ids)?;
        let mask = causal_mask(tokens.shape()[1] as usize, caches.offset())?;
        let mut tapped = Vec::with_capacity(taps.len());
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(
                &h,
                mask.as_ref(),
                &self.ropes,
                &mut LayerCaches::Target {
                    set: caches,
                    layer: i,
                },
                rows_alone,
            )?;
            if taps.contains(&i) {
                tapped.push((i, h.clone()));
            }
        }
        Ok(TargetOutput {
            hidden: self.norm.forward(&h)?,
            taps: concat_taps(taps, &tapped)?,
        })
    }
}

impl Target for Model {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn make_caches(&self) -> CacheSet {
        let c = &self.config;
        let mut caches: Vec<Box<dyn LayerCache>> = Vec::with_capacity(2 * self.layers.len());
        for _ in &self.layers {
            caches.push(Box::new(MlaCache::new(
                MlaRole::Target,
                c.kv_lora_rank,
                c.qk_rope,
            )));
            caches.push(Box::new(IndexerCache::new()));
        }
        CacheSet::new(caches)
    }

    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.run(tokens, caches, taps, false)
    }

    /// Each row as a single query: the absorbed latent and the indexer's
    /// picks per row, as mlx-lm computes one query (its several-query form
    /// rounds differently).
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.run(tokens, caches, taps, true)
    }

    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        Ok(self.head.forward(hidden)?)
    }

    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        Ok(self.embed.forward(tokens)?)
    }

    fn weights_bytes(&self) -> usize {
        Model::weights_bytes(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
