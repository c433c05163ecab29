//! The llama family as mlx-lm defines it (`llama`, `mistral`, `qwen2`,
//! `qwen3`, `qwen3_moe`): pre-norm decoder blocks with grouped-query
//! attention, RoPE (default, linear, llama3, yarn), SwiGLU MLP or (`qwen3_moe`)
//! an expert block ([`crate::sparse_moe`]) where the config says, optional
//! q/k norms (qwen3), optional attention biases (qwen2), tied or untied
//! head. Reference: mlx-lm 0.32.2 `models/llama.py`, `qwen2.py`,
//! `qwen3.py`, `qwen3_moe.py`.

mod config;
mod gpt_oss;
#[cfg(test)]
mod gpt_oss_tests;
#[cfg(test)]
mod moe_tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs::Array;
use spec_core::{CacheSet, LayerCache, RowForm, SpecError, TargetInfo};
use spec_runtime::experts::ExpertStore;

use crate::adapter;
use crate::batch::{attention, Packed};
use crate::cache::{
    quantized_mut, KvCache, KvQuantization, QuantizedKvCache, SinkWindowKvCache, SlidingKvCache,
    MAX_KV_SINKS,
};
use crate::config::read_config;
use crate::family::{family_target, Family, StageFamily};
use crate::layers::{concat_taps, Embedding, Linear, RmsNorm};
use crate::mask::{bounded_mask, Window};
use crate::pipeline::{layer_of, partial_forward, PipelineSlice};
use crate::rope::Rope;
use crate::sdpa::{self, Mask};
use crate::sparse_moe::{self, FeedForward, MoeFlavor};
use crate::weights::{Weights, WeightsView};
use crate::{LoadOptions, ModelError};

pub use config::Config;
use config::ConfigFile;

#[derive(Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// Per-head attention sinks `[heads]` (gpt-oss).
    sinks: Option<Array>,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

#[derive(Debug)]
struct Block {
    attn: Attention,
    mlp: FeedForward,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
    /// The layer's sliding window, or `--max-kv-size`'s over a full layer.
    window: Option<Window>,
}

/// A loaded llama-family model.
#[derive(Debug)]
pub struct Model {
    config: Config,
    info: TargetInfo,
    rope: Rope,
    embed: Embedding,
    blocks: Vec<Block>,
    /// The global indices of `blocks` (all layers unless a pipeline slice).
    range: std::ops::Range<usize>,
    slice: Option<PipelineSlice>,
    /// The final norm (absent on pipeline ranks other than 0).
    norm: Option<RmsNorm>,
    head: Option<Linear>,
    /// Full-attention layers keep their keys and values quantized
    /// (`--kv-bits`); sliding layers' windows stay float.
    kv_quantization: Option<KvQuantization>,
    /// The store the routed experts stream from (`None`: resident).
    experts: Option<Arc<ExpertStore>>,
}

impl Attention {
    fn load(vb: &WeightsView<'_>, c: &Config) -> Result<Self, ModelError> {
        let (h, qd, kd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let norm = |name: &str| RmsNorm::load(&vb.pp(name), c.head_dim, c.eps);
        Ok(Self {
            q: Linear::load(&vb.pp("q_proj"), h, qd, c.qkv_bias)?,
            k: Linear::load(&vb.pp("k_proj"), h, kd, c.qkv_bias)?,
            v: Linear::load(&vb.pp("v_proj"), h, kd, c.qkv_bias)?,
            o: Linear::load(&vb.pp("o_proj"), qd, h, c.o_bias)?,
            q_norm: if c.qk_norm {
                Some(norm("q_norm")?)
            } else {
                None
            },
            k_norm: if c.qk_norm {
                Some(norm("k_norm")?)
            } else {
                None
            },
            sinks: if c.sinks {
                Some(vb.take_cast("sinks", &[c.heads])?)
            } else {
                None
            },
            heads: c.heads,
            kv_heads: c.kv_heads,
            scale: c.scale,
        })
    }

    /// Attention over the packed rows `x` (`[B, T, hidden]`): projections
    /// over every token at once, then each row over its own cache (layer
    /// `layer` of its set) at its own offset, rows of one short window
    /// length together (`batch::attention`).
    fn forward(
        &self,
        x: &Array,
        rope: &Rope,
        packed: &mut Packed<'_>,
        layer: usize,
        window: Option<Window>,
    ) -> Result<Array, ModelError> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let split = |t_: Array, heads: i32, norm: &Option<RmsNorm>| -> Result<Array, ModelError> {
            let t_ = t_.reshape(&[b, t, heads, -1])?;
            match norm {
                Some(n) => n.forward(&t_),
                None => Ok(t_),
            }
        };
        let queries = split(self.q.forward(x)?, self.heads, &self.q_norm)?;
        let keys = split(self.k.forward(x)?, self.kv_heads, &self.k_norm)?;
        let values = split(self.v.forward(x)?, self.kv_heads, &None)?;
        let inputs = attention::Layer {
            queries: &queries,
            keys: &keys,
            values: &values,
            rope,
            layer,
            window,
            scale: self.scale,
            sinks: self.sinks.as_ref(),
        };
        let out = attention::attend(packed, &inputs, |packed, r| {
            let heads_first = |a: &Array| -> Result<Array, ModelError> {
                Ok(packed.slice(a, r)?.transpose_axes(&[0, 2, 1, 3])?)
            };
            let (q, k, v) = (
                heads_first(&queries)?,
                heads_first(&keys)?,
                heads_first(&values)?,
            );
            let cache = packed.rows[r].cache(layer)?;
            self.attend_row(q, k, v, rope, cache, window)
        })?;
        self.o.forward(&out)
    }

    /// One row's attention: `[B, heads, L, D]` queries, keys and values
    /// before RoPE, over `cache`; returns `[B, L, heads * D]`.
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
        if let Some(quantized) = quantized_mut(cache) {
            let out = quantized.attend(&queries, &keys, &values, self.scale)?;
            return Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?);
        }
        let (keys, values) = cache.update_and_fetch(&keys, &values)?;
        let fetched = keys.shape()[2] as usize;
        let mask = bounded_mask(window, offset, l as usize, fetched)?;
        let mask = Mask::or_causal(mask.as_ref(), l as usize);
        let out = match &self.sinks {
            Some(sinks) => {
                sdpa::attention_with_sinks(&queries, &keys, &values, self.scale, mask, sinks)?
            }
            None => sdpa::attention(&queries, &keys, &values, self.scale, mask)?,
        };
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

impl Model {
    /// Loads a llama-family model directory.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, ModelError> {
        Self::load_slice(dir, options, None)
    }

    /// Loads one pipeline rank's layers (`None`: the whole model); the
    /// other ranks' layer tensors are discarded unread, and only rank 0
    /// reads the final norm and the head.
    pub fn load_slice(
        dir: &Path,
        options: &LoadOptions,
        slice: Option<PipelineSlice>,
    ) -> Result<Self, ModelError> {
        let (file, path): (ConfigFile, PathBuf) = read_config(dir)?;
        let (config, rope) = config::parse(file, &path)?;
        let streams = crate::architectures::streaming().contains(&config.model_type.as_str());
        let experts = match (options.expert_cache_bytes, config.moe) {
            (None, _) => None,
            (Some(bytes), Some(_)) if streams => Some(ExpertStore::open(dir, bytes)?),
            (Some(_), _) => return Err(no_experts(&path, &config)),
        };
        Self::build(
            config,
            rope,
            Weights::from_dir(dir)?,
            options,
            slice,
            experts,
        )
    }

    /// Builds a model from a `config.json`-shaped value and a weight store
    /// already named as Hugging Face names them (the GGUF loader's path).
    /// `source` names the file in errors.
    pub fn from_config_value(
        config: serde_json::Value,
        source: &Path,
        weights: Weights,
        options: &LoadOptions,
    ) -> Result<Self, ModelError> {
        let file: ConfigFile =
            serde_json::from_value(config).map_err(|e| ModelError::config_parse(source, "", e))?;
        let (config, rope) = config::parse(file, source)?;
        if options.expert_cache_bytes.is_some() {
            return Err(no_experts(source, &config));
        }
        Self::build(config, rope, weights, options, None, None)
    }

    fn build(
        config: Config,
        rope: Rope,
        mut w: Weights,
        options: &LoadOptions,
        slice: Option<PipelineSlice>,
        experts: Option<Arc<ExpertStore>>,
    ) -> Result<Self, ModelError> {
        // mlx-lm's sanitize of each expert block's Hugging Face layout.
        match config.moe.map(|m| (m.flavor, m.experts)) {
            Some((MoeFlavor::GptOss, _)) => {
                gpt_oss::sanitize(&w, config.layers, experts.is_some())?
            }
            // Per-expert tensors stacked (streamed experts are read from
            // the files in either layout).
            Some((MoeFlavor::Qwen, n)) if experts.is_none() => {
                for i in (0..config.layers).filter(|i| config.sparse[*i]) {
                    sparse_moe::stack_per_expert(&w, &format!("model.layers.{i}.mlp"), n)?;
                }
            }
            _ => {}
        }
        // The adapter's names are mlx-lm's module paths: the sanitized ones.
        adapter::apply_option(options, &mut w, config.layers)?;
        if options.kv_quantization.is_some() && config.sinks {
            return Err(ModelError::LoadOption {
                option: "--kv-bits",
                message: format!(
                    "`{}` attends with sinks, which quantized keys and values do not take (nor mlx-lm's quantized attention)",
                    config.model_type
                ),
            });
        }
        let kv_quantization = options
            .kv_quantization
            .map(|q| q.check_head_dim(config.head_dim))
            .transpose()?;
        w.discard_where(|name| name.contains("self_attn.rotary_emb.inv_freq"));
        let head_here = slice.is_none_or(|s| s.holds_head());
        if config.tied || !head_here {
            // mlx-lm drops a redundant head of tied checkpoints the same way.
            w.discard_where(|name| name.starts_with("lm_head."));
        }
        let range = match slice {
            Some(s) => s.layers(config.layers)?,
            None => 0..config.layers,
        };
        if let Some(s) = slice.filter(|s| s.size() > 1) {
            // The head decides alone whether its caches can roll back (a
            // sliding cache stops being trimmable once it rotates); the
            // other ranks' caches must always be able to follow.
            let head = PipelineSlice::layers_of(0, s.size(), config.layers)?;
            let off_head =
                (0..config.layers).find(|i| config.windows[*i].is_some() && !head.contains(i));
            if let Some(i) = off_head {
                return Err(crate::pipeline::SplitError::SlidingOffHead {
                    layer: i,
                    start: head.start,
                    end: head.end,
                }
                .into());
            }
        }
        // Other ranks' layers (and, off rank 0, the final norm) by rule.
        w.discard_where(|name| {
            layer_of(name).is_some_and(|i| !range.contains(&i))
                || (!head_here && name.starts_with("model.norm."))
        });
        let c = &config;
        let vb = w.view(&c.quantization, options.dtype);
        let embed = Embedding::load(&vb.pp("model.embed_tokens"), c.vocab, c.hidden)?;
        let mut blocks = Vec::with_capacity(range.len());
        for (i, window) in c.windows.iter().enumerate() {
            if !range.contains(&i) {
                continue;
            }
            let p = vb.pp("model.layers").pp(i);
            let _span = tracing::debug_span!("load_layer", layer = i).entered();
            let h = c.hidden;
            let sparse = c.moe.filter(|_| c.sparse[i]);
            blocks.push(Block {
                attn: Attention::load(&p.pp("self_attn"), c)?,
                mlp: FeedForward::load(
                    &p.pp("mlp"),
                    sparse,
                    h,
                    c.intermediate,
                    c.mlp_bias,
                    experts.as_ref(),
                )?,
                input_norm: RmsNorm::load(&p.pp("input_layernorm"), h, c.eps)?,
                post_norm: RmsNorm::load(&p.pp("post_attention_layernorm"), h, c.eps)?,
                window: match (window, options.max_kv_size) {
                    (Some(w), _) => Some(Window::sliding(*w)),
                    // mlx-lm's `RotatingKVCache(max_kv_size, keep=4)`.
                    (None, Some(size)) => Some(Window {
                        size,
                        sinks: MAX_KV_SINKS,
                    }),
                    (None, None) => None,
                },
            });
            if let Some(progress) = &options.progress {
                progress(i + 1 - range.start, range.len());
            }
        }
        let norm = if head_here {
            Some(RmsNorm::load(&vb.pp("model.norm"), c.hidden, c.eps)?)
        } else {
            None
        };
        let head = if c.tied || !head_here {
            None
        } else {
            Some(Linear::load(&vb.pp("lm_head"), c.hidden, c.vocab, false)?)
        };
        w.finish()?;
        let info = TargetInfo {
            model_type: c.model_type.clone(),
            vocab_size: c.vocab as usize,
            hidden_size: c.hidden as usize,
            num_layers: c.layers,
            context_length: c.context_length,
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
            kv_quantization,
            experts,
        })
    }

    /// The store the routed experts stream from (`None`: resident).
    pub fn expert_store(&self) -> Option<&Arc<ExpertStore>> {
        self.experts.as_ref()
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The forward over packed rows: post-norm hidden states and taps,
    /// `[B, T, ..]`.
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

    fn partial(&self) -> SpecError {
        match self.slice {
            Some(s) => partial_forward(s, &self.range, self.config.layers),
            None => spec_core::InputError::NotLoaded { part: "final norm" }.into(),
        }
    }

    /// The held layers over packed rows from `h`: the last layer's output
    /// and the outputs of the held layers listed in `taps`.
    fn run_layers(
        &self,
        mut h: Array,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        let mut tapped = Vec::with_capacity(taps.len());
        for (local, block) in self.blocks.iter().enumerate() {
            let r = block.attn.forward(
                &block.input_norm.forward(&h)?,
                &self.rope,
                packed,
                local,
                block.window,
            )?;
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

    /// Bytes of all weights, as held in memory.
    pub fn weights_bytes(&self) -> usize {
        let norm = |n: &Option<RmsNorm>| n.as_ref().map_or(0, RmsNorm::nbytes);
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let a = &b.attn;
                a.q.nbytes()
                    + a.sinks.as_ref().map_or(0, Array::nbytes)
                    + a.k.nbytes()
                    + a.v.nbytes()
                    + a.o.nbytes()
                    + norm(&a.q_norm)
                    + norm(&a.k_norm)
                    + b.mlp.nbytes()
                    + b.input_norm.nbytes()
                    + b.post_norm.nbytes()
            })
            .sum();
        blocks
            + self.embed.nbytes()
            + self.norm.as_ref().map_or(0, RmsNorm::nbytes)
            + self.head.as_ref().map_or(0, Linear::nbytes)
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
    /// Decoding rows in their own form: an expert layer never sorts them
    /// (attention and dense layers compute both forms alike).
    const DECODE_FORM: RowForm = RowForm::Decode;

    /// Split-invariant without expert layers: every product is
    /// row-invariant (our GEMM front), attention runs per query over keys
    /// in time order, and decoding rows are the prefill form
    /// (`tests/tests/split_invariance.rs` checks it). An expert layer
    /// sorts a long prompt chunk's picks, as mlx-lm does.
    fn split_invariant(&self) -> bool {
        self.config.moe.is_none()
    }

    fn target_info(&self) -> &TargetInfo {
        &self.info
    }

    fn fresh_caches(&self) -> CacheSet {
        CacheSet::new(
            self.blocks
                .iter()
                .map(|b| -> Box<dyn LayerCache> {
                    match b.window {
                        Some(Window { size, sinks: 0 }) => Box::new(SlidingKvCache::new(size)),
                        Some(Window { size, sinks }) => {
                            Box::new(SinkWindowKvCache::new(size, sinks))
                        }
                        None => match self.kv_quantization {
                            Some(q) => Box::new(QuantizedKvCache::new(q)),
                            None => Box::new(KvCache::new()),
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

impl StageFamily for Model {
    fn stage_slice(&self) -> Option<PipelineSlice> {
        self.slice
    }

    fn held_layers(&self) -> std::ops::Range<usize> {
        self.range.clone()
    }

    fn layers_of_rank(
        &self,
        rank: usize,
        size: usize,
    ) -> Result<std::ops::Range<usize>, ModelError> {
        PipelineSlice::layers_of(rank, size, self.config.layers)
    }

    fn check_stage(&self, packed: &Packed<'_>) -> Result<(), SpecError> {
        let layers = self.blocks.len();
        packed.check(layers, layers, "one per layer", &[], 1)
    }

    fn run_held(
        &self,
        h: Array,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        self.run_layers(h, packed, taps)
    }

    fn final_norm(&self) -> Option<&RmsNorm> {
        self.norm.as_ref()
    }

    fn partial(&self) -> SpecError {
        Model::partial(self)
    }
}

/// The error of `--expert-cache-bytes` on a model without expert layers,
/// or whose experts do not stream.
fn no_experts(path: &Path, c: &Config) -> ModelError {
    let why = match c.moe {
        None => "has no routed experts to stream".to_owned(),
        Some(_) => format!(
            "streams no experts (streamed: {})",
            crate::architectures::streaming().join(", ")
        ),
    };
    ModelError::LoadOption {
        option: spec_runtime::experts::TIER_OPTION,
        message: format!("{}: this `{}` model {why}", path.display(), c.model_type),
    }
}
