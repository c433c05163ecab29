//! `qwen3_next` and `qwen3_5` (dense) as mlx-lm 0.32.2 defines them
//! (`models/qwen3_next.py`, `qwen3_5.py`, `gated_delta.py`; `qwen3_5` reads
//! a multimodal checkpoint's `text_config` and drops its vision tower): a
//! hybrid stack where every `full_attention_interval`-th
//! layer is gated full attention (output gate, q/k norms, partial rotary)
//! and the others are Gated DeltaNet linear attention (a causal conv state
//! and a recurrent state per layer, [`DeltaCache`]), each followed by a
//! SwiGLU MLP or a mixture-of-experts block with a gated shared expert
//! (`qwen3_next`'s sparse layers, every layer of `qwen3_5_moe`).
//!
//! Its recurrent caches roll back exactly over the positions since the
//! host's last commit (each position's states are kept, [`DeltaCache`]), so
//! speculative rounds run; a copy of a cache holds its last states only, so
//! a prefix-cache entry serves exactly its own length.

mod attention;
pub mod cache;
pub mod config;
mod delta;
mod layer_pattern;
mod mtp;
mod qwen3_5_config;
mod sanitize;
mod stage;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs::Array;
use spec_core::{CacheSet, LayerCache, RowForm, SpecError, TargetInfo};
use spec_runtime::experts::ExpertStore;

use crate::adapter;
use crate::batch::Packed;
use crate::cache::{KvCache, KvQuantization, QuantizedKvCache, SinkWindowKvCache, MAX_KV_SINKS};
use crate::config::{read_config, ConfigHeader};
use crate::family::{family_target, Family};
use crate::layers::{concat_taps, Embedding, Linear, RmsNorm};
use crate::mask::Window;
use crate::pipeline::{partial_forward, PipelineSlice};
use crate::rope::Rope;
use crate::sparse_moe::FeedForward;
use crate::weights::Weights;
use crate::{LoadOptions, ModelError};

use attention::GatedAttention;
pub use cache::{DeltaCache, DeltaStates, ROLLBACK_LIMIT};

/// The MTP head's key/value cache (one row per position, `[1, kv_heads,
/// T, head_dim]` keys and values).
pub type MtpCache = KvCache;
use config::{Config, ConfigFile, Mixer};
use delta::GatedDeltaNet;
use mtp::MtpHead;

#[derive(Debug)]
enum TokenMixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

#[derive(Debug)]
struct Block {
    mixer: TokenMixer,
    mlp: FeedForward,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
}

/// A loaded `qwen3_next` or `qwen3_5` model, or a pipeline rank's slice of
/// its layers.
#[derive(Debug)]
pub struct Model {
    config: Config,
    info: TargetInfo,
    rope: Rope,
    embed: Embedding,
    blocks: Vec<Block>,
    /// The global indices of `blocks` (all layers unless a slice).
    range: std::ops::Range<usize>,
    slice: Option<PipelineSlice>,
    /// Off the rank that holds the head: none.
    norm: Option<RmsNorm>,
    head: Option<Linear>,
    /// The checkpoint's MTP head, when it has one (whole models only).
    mtp: Option<MtpHead>,
    /// The store the routed experts stream from (`None`: resident).
    experts: Option<Arc<ExpertStore>>,
    /// Full-attention layers keep their keys and values quantized
    /// (`--kv-bits`); the MTP head's layer stays float.
    kv_quantization: Option<KvQuantization>,
    /// Full-attention layers keep the first positions and the last ones
    /// (`--max-kv-size`); the MTP head's layer keeps all.
    window: Option<Window>,
}

impl Model {
    /// The store the routed experts stream from (`None`: resident).
    pub fn expert_store(&self) -> Option<&Arc<ExpertStore>> {
        self.experts.as_ref()
    }

    /// Loads a `qwen3_next` or `qwen3_5` model directory (`qwen3_next` in
    /// mlx-lm's layout: depthwise conv weights `[channels, kernel, 1]`,
    /// norms as stored; `qwen3_5` in either layout, sanitized as mlx-lm
    /// does).
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, ModelError> {
        Self::load_slice(dir, options, None)
    }

    /// [`Model::load`], holding only `slice`'s layers (and, on the rank
    /// that holds the head, the final norm and the head).
    pub fn load_slice(
        dir: &Path,
        options: &LoadOptions,
        slice: Option<PipelineSlice>,
    ) -> Result<Self, ModelError> {
        let (header, config_path): (ConfigHeader, PathBuf) = read_config(dir)?;
        let mut w = Weights::from_dir(dir)?;
        let experts = options
            .expert_cache_bytes
            .map(|bytes| ExpertStore::open(dir, bytes))
            .transpose()?;
        let streamed = experts.is_some();
        let (config, rope, root, head) = if header.model_type.starts_with("qwen3_5") {
            let (file, path): (qwen3_5_config::ConfigFile, PathBuf) = read_config(dir)?;
            let (config, rope) = qwen3_5_config::parse(file, &path)?;
            sanitize::qwen3_5(&mut w, &config, streamed)?;
            (config, rope, sanitize::ROOT, sanitize::HEAD)
        } else {
            let (file, path): (ConfigFile, PathBuf) = read_config(dir)?;
            let (config, rope) = config::parse(file, &path)?;
            sanitize::qwen3_next(&mut w, &config, streamed)?;
            if config.tied {
                // mlx-lm drops a redundant head of tied checkpoints.
                w.discard_where(|name| name.starts_with("lm_head."));
            }
            (config, rope, "model", "lm_head")
        };
        // The adapter's names are mlx-lm's module paths: the sanitized ones.
        adapter::apply_option(options, &mut w, config.mixers.len())?;
        let head_here = slice.is_none_or(|s| s.holds_head());
        let range = stage::held(&config, slice)?;
        // Other ranks' layers (and, off the head's rank, norm and head).
        let layers = format!("{root}.layers.");
        let (norm_prefix, head_prefix) = (format!("{root}.norm."), format!("{head}."));
        w.discard_where(|name| {
            let other_layer = name
                .strip_prefix(&layers)
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| !range.contains(&i));
            other_layer
                || (!head_here
                    && (name.starts_with(&norm_prefix) || name.starts_with(&head_prefix)))
        });
        let kv_quantization = options
            .kv_quantization
            .map(|q| q.check_head_dim(config.head_dim))
            .transpose()?;
        let c = &config;
        if streamed && c.moe.is_none() {
            return Err(ModelError::LoadOption {
                option: spec_runtime::experts::TIER_OPTION,
                message: format!(
                    "{}: this `{}` model has no routed experts to stream",
                    config_path.display(),
                    c.model_type
                ),
            });
        }
        let vb = w.view(&c.quantization, options.dtype);
        let embed = Embedding::load(&vb.pp(root).pp("embed_tokens"), c.vocab, c.hidden)?;
        let mut blocks = Vec::with_capacity(c.mixers.len());
        for (i, mixer) in c.mixers.iter().enumerate() {
            if !range.contains(&i) {
                continue;
            }
            let p = vb.pp(root).pp("layers").pp(i);
            let _span = tracing::debug_span!("load_layer", layer = i).entered();
            let mixer = match mixer {
                Mixer::Linear => TokenMixer::Linear(GatedDeltaNet::load(
                    &p.pp("linear_attn"),
                    c.linear,
                    c.layout,
                    c.hidden,
                    c.eps,
                )?),
                Mixer::Full => TokenMixer::Full(GatedAttention::load(&p.pp("self_attn"), c)?),
            };
            blocks.push(Block {
                mixer,
                mlp: FeedForward::load(
                    &p.pp("mlp"),
                    c.moe.filter(|_| c.sparse.get(i) == Some(&true)),
                    c.hidden,
                    c.intermediate,
                    false,
                    experts.as_ref(),
                )?,
                input_norm: RmsNorm::load(&p.pp("input_layernorm"), c.hidden, c.eps)?,
                post_norm: RmsNorm::load(&p.pp("post_attention_layernorm"), c.hidden, c.eps)?,
            });
            if let Some(progress) = &options.progress {
                progress(i + 1, c.mixers.len());
            }
        }
        let norm = if head_here {
            Some(RmsNorm::load(&vb.pp(root).pp("norm"), c.hidden, c.eps)?)
        } else {
            None
        };
        let head = if c.tied || !head_here {
            None
        } else {
            Some(Linear::load(&vb.pp(head), c.hidden, c.vocab, false)?)
        };
        // The MTP head drafts for a whole model only (it reads the last
        // layer's output and the head).
        let mtp = if slice.is_none() && MtpHead::present(&w) {
            Some(MtpHead::load(&w, &vb, c)?)
        } else {
            w.discard_where(|name| name.starts_with("mtp."));
            None
        };
        w.finish()?;
        let info = TargetInfo {
            model_type: c.model_type.clone(),
            vocab_size: c.vocab as usize,
            hidden_size: c.hidden as usize,
            num_layers: c.mixers.len(),
            context_length: Some(c.context_length),
        };
        Ok(Self {
            config,
            info,
            rope,
            embed,
            blocks,
            range,
            slice,
            norm,
            head,
            mtp,
            experts,
            kv_quantization,
            window: options.max_kv_size.map(|size| Window {
                size,
                sinks: MAX_KV_SINKS,
            }),
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes of all weights, as held in memory.
    pub fn weights_bytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let mixer = match &b.mixer {
                    TokenMixer::Linear(d) => d.nbytes(),
                    TokenMixer::Full(a) => a.nbytes(),
                };
                mixer + b.mlp.nbytes() + b.input_norm.nbytes() + b.post_norm.nbytes()
            })
            .sum();
        blocks
            + self.embed.nbytes()
            + self.norm.as_ref().map_or(0, RmsNorm::nbytes)
            + self.head.as_ref().map_or(0, Linear::nbytes)
            + self.mtp.as_ref().map_or(0, MtpHead::nbytes)
    }

    /// Whether the checkpoint's MTP head is loaded.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Whether the MTP head over `tokens` rows at once computes them in
    /// mlx-lm's sorted expert form (whose bits depend on the chunk).
    pub fn mtp_sorts(&self, tokens: usize) -> bool {
        self.mtp.as_ref().is_some_and(|m| m.sorts(tokens))
    }

    /// A fresh key/value cache for the MTP head's layer.
    pub fn new_mtp_cache(&self) -> MtpCache {
        KvCache::new()
    }

    /// The MTP head over `tokens` (`[1, L]`), each paired with the target's
    /// post-norm hidden state that predicted it (`[1, L, hidden]`),
    /// appending `L` rows to `cache`: the head's normed output, which the
    /// target's head turns into logits and the next draft step takes as
    /// its hidden state.
    pub fn mtp_forward(
        &self,
        tokens: &Array,
        hidden: &Array,
        cache: &mut MtpCache,
    ) -> Result<Array, ModelError> {
        let mtp = self.mtp.as_ref().ok_or(ModelError::Spec(
            spec_core::InputError::NotLoaded { part: "MTP head" }.into(),
        ))?;
        mtp.forward(&self.embed.forward(tokens)?, hidden, &self.rope, cache)
    }

    /// The final norm over the last layer's output (a tap of the last
    /// layer): the post-norm hidden states the head reads.
    pub fn final_norm(&self, h: &Array) -> Result<Array, ModelError> {
        match &self.norm {
            Some(norm) => norm.forward(h),
            None => Err(ModelError::Spec(self.partial())),
        }
    }

    fn run(
        &self,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Option<Array>), SpecError> {
        let (Some(norm), None) = (&self.norm, self.slice.filter(|s| s.size() > 1)) else {
            return Err(self.partial());
        };
        let layers = self.blocks.len();
        packed.check(layers, layers, "one per layer", taps, layers)?;
        let h = self.embed.forward(&packed.ids)?;
        let (h, tapped) = self.run_layers(h, packed, taps)?;
        Ok((norm.forward(&h)?, concat_taps(taps, &tapped)?))
    }

    /// The held layers over packed rows from `h` (cache slots local, taps
    /// by global index): the last layer's output and the tapped outputs.
    fn run_layers(
        &self,
        mut h: Array,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        let mut tapped = Vec::with_capacity(taps.len());
        for (local, block) in self.blocks.iter().enumerate() {
            let x = block.input_norm.forward(&h)?;
            let r = match &block.mixer {
                TokenMixer::Linear(d) => d.forward(&x, packed, local)?,
                TokenMixer::Full(a) => a.forward(&x, &self.rope, packed, local, self.window)?,
            };
            let hh = h.add(&r)?;
            let r = block.mlp.forward(&block.post_norm.forward(&hh)?, packed)?;
            h = hh.add(&r)?;
            let i = self.range.start + local;
            if taps.contains(&i) {
                tapped.push((i, h.clone()));
            }
        }
        Ok((h, tapped))
    }

    fn partial(&self) -> SpecError {
        match self.slice {
            Some(s) => partial_forward(s, &self.range, self.config.mixers.len()),
            None => spec_core::InputError::NotLoaded { part: "final norm" }.into(),
        }
    }
}

impl crate::batch::PackedForward for Model {
    fn run_packed(
        &self,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Option<Array>), SpecError> {
        self.run(packed, taps)
    }
}

impl Family for Model {
    /// Decoding rows in their own form: an expert layer never sorts them,
    /// and a recurrent cache keeps each position's states to roll back to.
    const DECODE_FORM: RowForm = RowForm::Decode;
    /// Not claimed: an expert layer sorts a long prompt chunk's picks, and
    /// nothing checks the recurrence's chunking.
    fn split_invariant(&self) -> bool {
        false
    }

    fn target_info(&self) -> &TargetInfo {
        &self.info
    }

    fn fresh_caches(&self) -> CacheSet {
        CacheSet::new(
            self.blocks
                .iter()
                .map(|b| -> Box<dyn LayerCache> {
                    match b.mixer {
                        TokenMixer::Linear(_) => Box::new(DeltaCache::new()),
                        TokenMixer::Full(_) => match (self.window, self.kv_quantization) {
                            (Some(Window { size, sinks }), _) => {
                                Box::new(SinkWindowKvCache::new(size, sinks))
                            }
                            (None, Some(q)) => Box::new(QuantizedKvCache::new(q)),
                            (None, None) => Box::new(KvCache::new()),
                        },
                    }
                })
                .collect(),
        )
    }

    fn head_logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        Ok(match &self.head {
            Some(head) => head.forward(hidden)?,
            None if self.norm.is_none() => return Err(self.partial()),
            None => self.embed.as_linear(hidden)?,
        })
    }

    fn embed_tokens(&self, tokens: &Array) -> Result<Array, SpecError> {
        Ok(self.embed.forward(tokens)?)
    }

    fn held_bytes(&self) -> usize {
        self.weights_bytes()
    }
}

family_target!(Model);

#[cfg(test)]
mod moe_tests;
#[cfg(test)]
mod streamed_tests;
#[cfg(test)]
mod tests;
