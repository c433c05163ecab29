//! The Gemma-4 decoder, op for op as mlx-lm 0.32.2's `gemma4_text.py`.

use std::path::Path;
use std::sync::Arc;

use crate::sdpa::{self, Mask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{CacheSet, LayerCache, SpecError, TargetInfo};
use spec_runtime::experts::ExpertStore;

use super::config::{parse_value, Config, LayerKind, LayerSpec, RopeSpec};
use super::moe::{MoeBlock, MoeDims};
use crate::adapter;
use crate::batch::{self, Packed};
use crate::cache::KvCache;
use crate::cache::SlidingKvCache;
use crate::family::{family_target, Family};
use crate::layers::{gelu_approx, softcap, Activation, Embedding, GatedMlp, Linear, RmsNorm};
use crate::mask::window_mask;
use crate::rope::Rope;
use crate::weights::{Weights, WeightsView};
use crate::{DtypePolicy, LoadOptions, ModelError};

fn scalar(v: f64) -> Array {
    Array::from_f32(v as f32)
}

#[derive(Debug)]
struct Attention {
    q: Linear,
    /// Keys and values, absent on KV-shared layers.
    kv: Option<KvProjection>,
    o: Linear,
    q_norm: RmsNorm,
    heads: i32,
    head_dim: i32,
    eps: f32,
}

#[derive(Debug)]
struct KvProjection {
    k: Linear,
    /// Absent when keys double as values (`attention_k_eq_v`).
    v: Option<Linear>,
    k_norm: RmsNorm,
    kv_heads: i32,
}

#[derive(Debug)]
struct PerLayerGate {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

#[derive(Debug)]
struct Block {
    spec: LayerSpec,
    attn: Attention,
    mlp: GatedMlp,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    per_layer: Option<PerLayerGate>,
    moe: Option<MoeBlock>,
    layer_scalar: Array,
}

/// The per-layer input tables of E2B/E4B-style models.
#[derive(Debug)]
struct PerLayerInputs {
    embed: Embedding,
    projection: Linear,
    norm: RmsNorm,
    width: i32,
}

/// Keys and values one layer attended to, shared with the KV-shared layers
/// after it, and the position its queries were rotated at.
#[derive(Debug, Clone)]
struct SharedKv {
    keys: Array,
    values: Array,
    offset: usize,
}

/// A loaded Gemma-4 text model (`gemma4_text`, or the text part of `gemma4`).
#[derive(Debug)]
pub struct Model {
    config: Config,
    info: TargetInfo,
    embed: Embedding,
    per_layer: Option<PerLayerInputs>,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Option<Linear>,
    rope_sliding: Rope,
    rope_full: Rope,
    /// The store the routed experts stream from (`None`: resident).
    experts: Option<Arc<ExpertStore>>,
}

fn build_rope(spec: &RopeSpec, dims: i32, traditional: bool) -> Result<Rope, ModelError> {
    match *spec {
        RopeSpec::Base { theta, scale } => Ok(Rope::Base {
            dims,
            base: theta,
            scale,
            traditional,
        }),
        RopeSpec::Proportional {
            theta,
            rotated,
            factor,
        } => Rope::proportional(dims, rotated, theta, factor, traditional),
    }
}

/// Tensor-name prefixes: mlx-lm's module paths for this checkpoint.
struct Names {
    model: String,
    head: String,
}

impl Attention {
    fn load(
        vb: &WeightsView<'_>,
        c: &Config,
        spec: &LayerSpec,
        has_kv: bool,
    ) -> Result<Self, ModelError> {
        let (h, d) = (c.hidden, spec.head_dim);
        let kv = if has_kv {
            let kd = spec.kv_heads * d;
            Some(KvProjection {
                k: Linear::load(&vb.pp("k_proj"), h, kd, false)?,
                v: if spec.k_eq_v {
                    None
                } else {
                    Some(Linear::load(&vb.pp("v_proj"), h, kd, false)?)
                },
                k_norm: RmsNorm::load(&vb.pp("k_norm"), d, c.eps)?,
                kv_heads: spec.kv_heads,
            })
        } else {
            None
        };
        Ok(Self {
            q: Linear::load(&vb.pp("q_proj"), h, c.heads * d, false)?,
            kv,
            o: Linear::load(&vb.pp("o_proj"), c.heads * d, h, false)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), d, c.eps)?,
            heads: c.heads,
            head_dim: d,
            eps: c.eps,
        })
    }

    /// Attention of the packed rows `x` (`[B, T, hidden]`): projections and
    /// norms over every token at once, then each row over its own cache
    /// (slot `layer` of its set) or over `borrowed` (per row, the keys of
    /// the layer this one borrows from, in the same row), with its own mask
    /// (`masks`, per row). Returns the output and each row's keys.
    fn forward(
        &self,
        x: &Array,
        rope: &Rope,
        packed: &mut Packed<'_>,
        layer: usize,
        masks: &[(Option<Array>, bool)],
        borrowed: Option<&[SharedKv]>,
    ) -> Result<(Array, Vec<SharedKv>), ModelError> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let queries = self.q_norm.forward(&self.q.forward(x)?.reshape(&[
            b,
            t,
            self.heads,
            self.head_dim,
        ])?)?;
        let projected = match (borrowed, &self.kv) {
            (Some(_), _) => None,
            (None, Some(p)) => {
                let keys =
                    p.k.forward(x)?
                        .reshape(&[b, t, p.kv_heads, self.head_dim])?;
                let values = match &p.v {
                    Some(v) => v.forward(x)?.reshape(&[b, t, p.kv_heads, self.head_dim])?,
                    None => keys.clone(),
                };
                Some((
                    p.k_norm.forward(&keys)?,
                    mlx_rs::fast::rms_norm(&values, None, self.eps)?,
                ))
            }
            (None, None) => {
                return Err(SpecError::from(spec_core::InputError::ForeignCache(
                    "a gemma4 layer got neither its own cache nor shared keys".into(),
                ))
                .into())
            }
        };
        let spans = packed.spans.clone();
        let heads_first = |a: &Array, r: usize| -> Result<Array, ModelError> {
            Ok(batch::slice(&spans, a, r)?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let n = packed.rows.len();
        let mut outs = Vec::with_capacity(n);
        let mut kvs = Vec::with_capacity(n);
        for r in 0..n {
            let kv = match (borrowed, &projected) {
                (Some(shared), _) => shared
                    .get(r)
                    .cloned()
                    .ok_or(spec_core::InputError::MissingRow {
                        what: "borrowed keys",
                        row: r,
                        rows: shared.len(),
                    })
                    .map_err(SpecError::from)?,
                (None, Some((keys, values))) => {
                    let (keys, values) = (heads_first(keys, r)?, heads_first(values, r)?);
                    let cache = packed.rows[r].cache(layer)?;
                    let offset = cache.offset();
                    let keys = rope.apply(&keys, offset)?;
                    let (keys, values) = cache.update_and_fetch(&keys, &values)?;
                    SharedKv {
                        keys,
                        values,
                        offset,
                    }
                }
                (None, None) => {
                    return Err(SpecError::Internal("a gemma4 layer lost its keys").into())
                }
            };
            let (mask, causal) = masks
                .get(r)
                .ok_or(spec_core::InputError::MissingRow {
                    what: "mask",
                    row: r,
                    rows: masks.len(),
                })
                .map_err(SpecError::from)?;
            let q = rope.apply(&heads_first(&queries, r)?, kv.offset)?;
            outs.push(self.attend(&q, &kv, mask.as_ref(), *causal)?);
            kvs.push(kv);
        }
        Ok((self.o.forward(&Packed::join(outs)?)?, kvs))
    }

    /// One row's rotated queries `[B, heads, L, D]` over its keys; returns
    /// `[B, L, heads * D]`.
    fn attend(
        &self,
        queries: &Array,
        kv: &SharedKv,
        mask: Option<&Array>,
        causal: bool,
    ) -> Result<Array, ModelError> {
        let (b, l) = (queries.shape()[0], queries.shape()[2]);
        let mask = match (mask, causal) {
            (Some(m), _) => Mask::Array(m),
            (None, true) => Mask::Causal,
            (None, false) => Mask::None,
        };
        let out = sdpa::attention(queries, &kv.keys, &kv.values, 1.0, mask)?;
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }

    fn nbytes(&self) -> usize {
        let kv = self.kv.as_ref().map_or(0, |p| {
            p.k.nbytes() + p.v.as_ref().map_or(0, Linear::nbytes) + p.k_norm.nbytes()
        });
        self.q.nbytes() + self.o.nbytes() + self.q_norm.nbytes() + kv
    }
}

impl Block {
    fn nbytes(&self) -> usize {
        let per_layer = self.per_layer.as_ref().map_or(0, |g| {
            g.gate.nbytes() + g.projection.nbytes() + g.norm.nbytes()
        });
        self.attn.nbytes()
            + self.mlp.nbytes()
            + self.input_norm.nbytes()
            + self.post_attn_norm.nbytes()
            + self.pre_ff_norm.nbytes()
            + self.post_ff_norm.nbytes()
            + per_layer
            + self.moe.as_ref().map_or(0, MoeBlock::nbytes)
            + self.layer_scalar.nbytes()
    }
}

/// Whether a checkpoint tensor is one mlx-lm's `sanitize` drops.
fn dropped(name: &str, first_shared: usize) -> bool {
    const IGNORED: &[&str] = &[
        "self_attn.rotary_emb",
        "input_max",
        "input_min",
        "output_max",
        "output_min",
    ];
    const VISION: &[&str] = &[
        "vision_tower",
        "multi_modal_projector",
        "audio_tower",
        "embed_audio",
        "embed_vision",
        "vision_embedder",
    ];
    if IGNORED.iter().any(|s| name.contains(s)) || VISION.iter().any(|s| name.starts_with(s)) {
        return true;
    }
    // KV-shared layers borrow keys and values: their projections are unused.
    if [
        ".self_attn.k_proj",
        ".self_attn.v_proj",
        ".self_attn.k_norm",
    ]
    .iter()
    .any(|s| name.contains(s))
    {
        let layer = name
            .split("layers.")
            .nth(1)
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<usize>().ok());
        return layer.is_some_and(|i| i >= first_shared);
    }
    false
}

/// Hugging Face stores each MoE layer's expert projections fused
/// (`experts.gate_up_proj` `[E, 2I, H]`, `experts.down_proj`); mlx-lm splits
/// them into `experts.switch_glu.{gate,up,down}_proj.weight` at load.
fn split_fused_experts(vb: &WeightsView<'_>, intermediate: i32) -> Result<(), ModelError> {
    let fused = "experts.gate_up_proj";
    if vb.contains(fused) {
        let both = vb.take(fused)?;
        let shape = both.shape().to_vec();
        if shape.len() != 3 || shape[1] != 2 * intermediate {
            return Err(ModelError::TensorShape {
                name: vb.name(fused),
                found: shape.clone(),
                expected: vec![
                    shape.first().copied().unwrap_or(0),
                    2 * intermediate,
                    shape.last().copied().unwrap_or(0),
                ],
            });
        }
        let gate = both.index((.., ..intermediate, ..));
        let up = both.index((.., intermediate.., ..));
        vb.insert("experts.switch_glu.gate_proj.weight", gate.contiguous()?);
        vb.insert("experts.switch_glu.up_proj.weight", up.contiguous()?);
    }
    let down = "experts.down_proj";
    if vb.contains(down) {
        let d = vb.take(down)?;
        vb.insert("experts.switch_glu.down_proj.weight", d);
    }
    Ok(())
}

impl Model {
    /// Loads a `gemma4_text` or `gemma4` model directory.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::config_parse(&path, "", e))?;
        let config = parse_value(value, &path)?;
        Self::build(config, Weights::from_dir(dir)?, options)
    }

    fn build(config: Config, mut w: Weights, options: &LoadOptions) -> Result<Self, ModelError> {
        let names = if config.model_type == "gemma4" {
            // Hugging Face names the text model `model.language_model.*`;
            // mlx-lm's module paths (and its saved checkpoints) are
            // `language_model.model.*`.
            w.rename(|name| match name.strip_prefix("model.") {
                Some(rest) if rest.starts_with("language_model.") => {
                    rest.replacen("language_model.", "language_model.model.", 1)
                }
                Some(rest) => rest.to_owned(),
                None => name.to_owned(),
            })?;
            Names {
                model: "language_model.model".into(),
                head: "language_model.lm_head".into(),
            }
        } else {
            Names {
                model: "model".into(),
                head: "lm_head".into(),
            }
        };
        // The adapter's names are mlx-lm's module paths: the renamed ones.
        adapter::apply_option(options, &mut w, config.layers.len())?;
        let experts = options
            .expert_cache_bytes
            .map(|bytes| ExpertStore::open(w.dir(), bytes))
            .transpose()?;
        if experts.is_some() && config.moe.is_none() {
            return Err(ModelError::LoadOption {
                option: spec_runtime::experts::TIER_OPTION,
                message: format!(
                    "{}: this `{}` model has no routed experts to stream",
                    w.dir().display(),
                    config.model_type
                ),
            });
        }
        let first_shared = config.cached_layers;
        w.discard_where(|name| dropped(name, first_shared));
        if config.tied {
            w.discard_where(|name| name.starts_with(&format!("{}.", names.head)));
        }
        let c = &config;
        let vb = w.view(&c.quantization, options.dtype);
        let m = vb.pp(&names.model);
        let embed = Embedding::load(&m.pp("embed_tokens"), c.vocab, c.hidden)?;
        let n = c.layers.len() as i32;
        let per_layer = match c.per_layer_input {
            Some(width) => Some(PerLayerInputs {
                embed: Embedding::load(
                    &m.pp("embed_tokens_per_layer"),
                    c.vocab_per_layer,
                    n * width,
                )?,
                projection: Linear::load(
                    &m.pp("per_layer_model_projection"),
                    c.hidden,
                    n * width,
                    false,
                )?,
                norm: RmsNorm::load(&m.pp("per_layer_projection_norm"), width, c.eps)?,
                width,
            }),
            None => None,
        };
        let mut blocks = Vec::with_capacity(c.layers.len());
        for (i, spec) in c.layers.iter().enumerate() {
            let _span = tracing::debug_span!("load_layer", layer = i).entered();
            let p = m.pp("layers").pp(i);
            let norm = |name: &str| RmsNorm::load(&p.pp(name), c.hidden, c.eps);
            let gelu = Activation::GeluApprox;
            let mlp = GatedMlp::load(&p.pp("mlp"), c.hidden, spec.intermediate, false, gelu)?;
            let per_layer_gate = match c.per_layer_input {
                Some(width) => Some(PerLayerGate {
                    gate: Linear::load(&p.pp("per_layer_input_gate"), c.hidden, width, false)?,
                    projection: Linear::load(
                        &p.pp("per_layer_projection"),
                        width,
                        c.hidden,
                        false,
                    )?,
                    norm: norm("post_per_layer_input_norm")?,
                }),
                None => None,
            };
            let moe = match c.moe {
                Some(m) => {
                    if experts.is_none() {
                        split_fused_experts(&p, m.intermediate)?;
                    }
                    let dims = MoeDims {
                        hidden: c.hidden,
                        experts: m.experts,
                        top_k: m.top_k,
                        intermediate: m.intermediate,
                        eps: c.eps,
                    };
                    Some(MoeBlock::load(&p, dims, experts.as_ref())?)
                }
                None => None,
            };
            let layer_scalar = p.take_shaped("layer_scalar", &[1])?;
            let layer_scalar = if vb.policy() == DtypePolicy::Float32 {
                layer_scalar.as_dtype(Dtype::Float32)?
            } else {
                layer_scalar
            };
            blocks.push(Block {
                attn: Attention::load(&p.pp("self_attn"), c, spec, i < c.cached_layers)?,
                mlp,
                input_norm: norm("input_layernorm")?,
                post_attn_norm: norm("post_attention_layernorm")?,
                pre_ff_norm: norm("pre_feedforward_layernorm")?,
                post_ff_norm: norm("post_feedforward_layernorm")?,
                per_layer: per_layer_gate,
                moe,
                layer_scalar,
                spec: spec.clone(),
            });
            if let Some(progress) = &options.progress {
                progress(i + 1, c.layers.len());
            }
        }
        let norm = RmsNorm::load(&m.pp("norm"), c.hidden, c.eps)?;
        let head = if c.tied {
            None
        } else {
            Some(Linear::load(&vb.pp(&names.head), c.hidden, c.vocab, false)?)
        };
        w.finish()?;
        let dims = |kind: LayerKind| {
            c.layers
                .iter()
                .find(|l| l.kind == kind)
                .map_or(0, |l| l.head_dim)
        };
        let rope_sliding = build_rope(
            &c.rope_sliding,
            dims(LayerKind::Sliding),
            c.rope_traditional,
        )?;
        let rope_full = build_rope(&c.rope_full, dims(LayerKind::Full), c.rope_traditional)?;
        let info = TargetInfo {
            model_type: c.model_type.clone(),
            vocab_size: c.vocab as usize,
            hidden_size: c.hidden as usize,
            num_layers: c.layers.len(),
            context_length: Some(c.context_length),
        };
        Ok(Self {
            config,
            info,
            embed,
            per_layer,
            blocks,
            norm,
            head,
            rope_sliding,
            rope_full,
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

    /// Token embeddings times `sqrt(hidden)`, as the first layer sees them.
    fn scaled_embed(&self, ids: &Array) -> Result<Array, ModelError> {
        Ok(self
            .embed
            .forward(ids)?
            .multiply(scalar(f64::from(self.config.hidden).sqrt()))?)
    }

    /// `[B, L, layers, width]` per-layer inputs from the ids and the scaled
    /// embeddings `h` (mlx-lm's `_get_per_layer_inputs` then
    /// `_project_per_layer_inputs`).
    fn per_layer_inputs(
        &self,
        p: &PerLayerInputs,
        ids: &Array,
        h: &Array,
    ) -> Result<Array, ModelError> {
        let (b, l) = (h.shape()[0], h.shape()[1]);
        let n = self.blocks.len() as i32;
        let looked_up = p
            .embed
            .forward(ids)?
            .multiply(scalar(f64::from(p.width).sqrt()))?
            .reshape(&[b, l, n, p.width])?;
        let projected = p
            .projection
            .forward(h)?
            .multiply(scalar(f64::from(self.config.hidden).powf(-0.5)))?;
        let projected = p.norm.forward(&projected.reshape(&[b, l, n, p.width])?)?;
        Ok(projected
            .add(&looked_up)?
            .multiply(scalar(2f64.powf(-0.5)))?)
    }

    /// The mask of each layer kind for a window of `l` tokens at the caches'
    /// current offsets: `(array mask, causal)` as mlx-lm's `make_mask` picks.
    fn masks(&self, caches: &CacheSet, l: usize) -> Result<[(Option<Array>, bool); 2], ModelError> {
        let offset_of = |kind: LayerKind| {
            self.blocks
                .iter()
                .take(self.config.cached_layers)
                .position(|b| b.spec.kind == kind)
                .and_then(|i| caches.get(i))
                .map(|c| c.offset())
        };
        let full = (None, l > 1);
        let sliding = match offset_of(LayerKind::Sliding) {
            Some(offset) if l > 1 => {
                let w = self.config.sliding_window;
                let start = offset.min(w - 1);
                if start + l > w {
                    (Some(window_mask(start, l, 0, start + l, w)?), false)
                } else {
                    (None, true)
                }
            }
            _ => (None, false),
        };
        Ok([sliding, full])
    }

    /// Bytes of all weights, as held in memory.
    pub fn weights_bytes(&self) -> usize {
        let per_layer = self.per_layer.as_ref().map_or(0, |p| {
            p.embed.nbytes() + p.projection.nbytes() + p.norm.nbytes()
        });
        self.blocks.iter().map(Block::nbytes).sum::<usize>()
            + self.embed.nbytes()
            + per_layer
            + self.norm.nbytes()
            + self.head.as_ref().map_or(0, Linear::nbytes)
    }

    /// The RoPE of one layer kind (what a drafter attending over this
    /// model's keys applies to its queries).
    pub fn rope(&self, kind: LayerKind) -> &Rope {
        match kind {
            LayerKind::Sliding => &self.rope_sliding,
            LayerKind::Full => &self.rope_full,
        }
    }

    /// Indices (into the model's caches) of the last sliding and the last
    /// full layer that own a cache: the layers KV-shared layers and the
    /// Gemma-4 assistant drafter read.
    pub fn donor_layers(&self) -> (Option<usize>, Option<usize>) {
        let last = |kind: LayerKind| {
            self.blocks
                .iter()
                .take(self.config.cached_layers)
                .rposition(|b| b.spec.kind == kind)
        };
        (last(LayerKind::Sliding), last(LayerKind::Full))
    }

    /// The forward over packed rows: post-norm hidden states and taps,
    /// `[B, T, ..]`. Every row runs as it runs alone: its own masks, caches
    /// and KV-shared donors, and the expert block in its own form.
    fn run(
        &self,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Option<Array>), ModelError> {
        let cached = self.config.cached_layers;
        packed.check(
            cached,
            self.blocks.len(),
            "one per layer that holds keys of its own",
            taps,
            self.blocks.len(),
        )?;
        let ids = packed.ids.clone();
        let mut h = self.scaled_embed(&ids)?;
        let per_layer = match &self.per_layer {
            Some(p) => Some(self.per_layer_inputs(p, &ids, &h)?),
            None => None,
        };
        let mut sliding_masks = Vec::with_capacity(packed.rows.len());
        let mut full_masks = Vec::with_capacity(packed.rows.len());
        for (row, span) in packed.rows.iter().zip(&packed.spans) {
            let [sliding, full] = self.masks(row.caches, span.len())?;
            sliding_masks.push(sliding);
            full_masks.push(full);
        }
        let mut shared: Vec<Option<Vec<SharedKv>>> = vec![None; self.blocks.len()];
        let mut tapped = Vec::with_capacity(taps.len());
        for (i, block) in self.blocks.iter().enumerate() {
            let (rope, masks) = match block.spec.kind {
                LayerKind::Sliding => (&self.rope_sliding, &sliding_masks),
                LayerKind::Full => (&self.rope_full, &full_masks),
            };
            let source = block.spec.kv_source;
            let borrowed = if source == i {
                None
            } else {
                shared.get(source).and_then(Option::as_deref)
            };
            if source != i && borrowed.is_none() {
                return Err(SpecError::from(spec_core::InputError::ForeignCache(format!(
                    "layer {i} borrows keys from layer {source}, which produced none"
                )))
                .into());
            }
            let residual = h.clone();
            let (attn, kv) = block.attn.forward(
                &block.input_norm.forward(&h)?,
                rope,
                packed,
                i,
                masks,
                borrowed,
            )?;
            let hh = residual.add(&block.post_attn_norm.forward(&attn)?)?;
            let dense = block.mlp.forward(&block.pre_ff_norm.forward(&hh)?)?;
            let ff = match &block.moe {
                Some(moe) => {
                    let dense = moe.post_ff_norm_1.forward(&dense)?;
                    // Rows whose own forward would not regroup tokens by
                    // expert run together (the ungrouped form is
                    // row-invariant); the others alone, in their own form.
                    // The dense MLP computes while streamed experts are read.
                    let x = moe.pre_ff_norm_2.forward(&hh)?;
                    let experts = batch::grouped(
                        &packed.spans,
                        &[&hh, &x],
                        |r| !moe.regroups(packed.spans[r].len()),
                        |parts, alone| {
                            moe.forward(&parts[0], &parts[1], alone.is_some(), &[&dense])
                        },
                    )?;
                    block
                        .post_ff_norm
                        .forward(&dense.add(&moe.post_ff_norm_2.forward(&experts)?)?)?
                }
                None => block.post_ff_norm.forward(&dense)?,
            };
            let mut out = hh.add(&ff)?;
            if let (Some(g), Some(inputs)) = (&block.per_layer, &per_layer) {
                let gate = gelu_approx(&g.gate.forward(&out)?)?.multiply(inputs.index((
                    ..,
                    ..,
                    i as i32,
                    ..,
                )))?;
                let gate = g.norm.forward(&g.projection.forward(&gate)?)?;
                out = out.add(&gate)?;
            }
            h = out.multiply(&block.layer_scalar)?;
            if source == i {
                shared[i] = Some(kv);
            }
            if taps.contains(&i) {
                tapped.push((i, h.clone()));
            }
        }
        Ok((
            self.norm.forward(&h)?,
            crate::layers::concat_taps(taps, &tapped)?,
        ))
    }
}

impl crate::batch::PackedForward for Model {
    fn run_packed(
        &self,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Option<Array>), SpecError> {
        Ok(self.run(packed, taps)?)
    }
}

impl Family for Model {
    /// Split-invariant: every product is row-invariant (our GEMM front),
    /// attention runs per query over keys in time order (the sliding cache
    /// hands them out so), decoding rows are the prefill form, and the MoE
    /// block's regrouped form gives each token the bits of its ungrouped
    /// form (`tests/tests/split_invariance.rs` checks it).
    fn split_invariant(&self) -> bool {
        true
    }

    fn target_info(&self) -> &TargetInfo {
        &self.info
    }

    fn fresh_caches(&self) -> CacheSet {
        CacheSet::new(
            self.blocks
                .iter()
                .take(self.config.cached_layers)
                .map(|b| -> Box<dyn LayerCache> {
                    match b.spec.kind {
                        LayerKind::Sliding => {
                            Box::new(SlidingKvCache::new(self.config.sliding_window))
                        }
                        LayerKind::Full => Box::new(KvCache::new()),
                    }
                })
                .collect(),
        )
    }

    fn head_logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        let logits = self.head_logits_before_softcap(hidden)?;
        Ok(match self.config.softcap {
            Some(cap) => softcap(&logits, cap)?,
            None => logits,
        })
    }

    fn head_logits_before_softcap(&self, hidden: &Array) -> Result<Array, SpecError> {
        Ok(match &self.head {
            Some(head) => head.forward(hidden)?,
            None => self.embed.as_linear(hidden)?,
        })
    }

    /// Token embeddings scaled by `sqrt(hidden)`, as the first layer sees them.
    fn embed_tokens(&self, tokens: &Array) -> Result<Array, SpecError> {
        Ok(self.scaled_embed(tokens)?)
    }

    fn held_bytes(&self) -> usize {
        self.weights_bytes()
    }
}

family_target!(Model);
