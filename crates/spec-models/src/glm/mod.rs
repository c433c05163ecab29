//! `glm_moe_dsa` (GLM-5.x) as mlx-lm 0.32.2 defines it (`glm_moe_dsa.py` over
//! `deepseek_v32.py`): multi-head latent attention with a compressed cache
//! and interleaved partial RoPE, the DSA indexer (sparse attention past
//! `index_topk` keys), dense MLPs in the first `first_k_dense_replace` layers
//! and a routed mixture of experts after them. Weights are read in mlx-lm's
//! layout (stacked `switch_mlp` experts, `embed_q` / `unembed_out`), float or
//! affine-quantized, or, float only, in Hugging Face's (`layout`).
//!
//! GLM-5.2's IndexShare (transformers 5.24's `glm_moe_dsa`): only the layers
//! the schedule marks "full" (`schedule`) carry `self_attn.indexer.*` and an
//! indexer cache; a "shared" layer attends to the keys the previous full
//! layer picked, row by row in the single-query form and as the same mask in
//! the window form. Without GLM-5.2's keys every layer is full (mlx-lm).
//!
//! Unlike mlx-lm, the loader keeps the multi-token-prediction row that GLM
//! checkpoints carry at layer index `num_hidden_layers` (`enorm`, `hnorm`,
//! `eh_proj`, a decoder layer, `shared_head.norm`): the `glm52-native-mtp`
//! draft provider runs it through `mtp_forward` / `mtp_draft_step` /
//! `mtp_logits`. The row runs its own DSA indexer with its own indexer cache
//! when it carries `self_attn.indexer.*` (GLM-5.2 does), dense attention
//! otherwise.

mod attention;
#[cfg(test)]
mod batch_tests;
mod cache;
mod config;
#[cfg(test)]
mod index_share_tests;
mod layout;
mod moe;
mod schedule;
#[cfg(test)]
mod streamed_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::{CacheSet, LayerCache, RowForm, SpecError, TargetInfo};

use self::attention::{Attention, LayerCaches, RowMode, Selection};
pub use self::cache::{IndexerCache, MlaCache, MlaRole, MtpCache};
pub use self::config::{Config, MoeConfig};
use self::config::{ConfigFile, Ropes};
use self::moe::{mlp, Experts, FeedForward, Moe};
pub use self::schedule::IndexerType;
use crate::batch::{self, Packed};
use crate::config::read_config;
use crate::family::{family_target, Family, StageFamily};
use crate::layers::{concat_taps, Embedding, Linear, RmsNorm};
use crate::mask::causal_mask;
use crate::pipeline::{layer_of, partial_forward, PipelineSlice};
use crate::weights::{Weights, WeightsView};
use crate::{LoadOptions, ModelError};
use spec_runtime::experts::{ExpertStats, ExpertStore};

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
        experts: Experts<'_>,
    ) -> Result<Self, ModelError> {
        let ffn = match &c.moe {
            Some(m) if c.is_moe_layer(index) => {
                FeedForward::Moe(Box::new(Moe::load(&vb.pp("mlp"), c, m, experts)?))
            }
            _ => FeedForward::Dense(Box::new(mlp(&vb.pp("mlp"), c.hidden, c.intermediate)?)),
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

    /// The layer over packed rows (`spans`), each with its caches, mode
    /// and reused selection (see `Attention::forward`). The MoE runs
    /// together, ungrouped (row-invariant), the rows whose own forward would
    /// not regroup tokens by expert (decoding rows, short windows), and
    /// every other row alone in its own form (the grouped kernels may round
    /// a token differently).
    fn forward(
        &self,
        x: &Array,
        spans: &[Range<usize>],
        caches: &mut [LayerCaches<'_>],
        modes: &[RowMode],
        reuse: &[Option<&Selection>],
        ropes: &Ropes,
    ) -> Result<(Array, Vec<Option<Selection>>), ModelError> {
        let (r, selections) = self.attn.forward(
            &self.input_norm.forward(x)?,
            spans,
            caches,
            modes,
            reuse,
            ropes,
        )?;
        let h = x.add(&r)?;
        let normed = self.post_norm.forward(&h)?;
        let rows_alone = |r: usize| modes.get(r).is_some_and(|m| m.rows_alone);
        let r = match &self.ffn {
            FeedForward::Dense(m) => m.forward(&normed)?,
            FeedForward::Moe(m) => batch::grouped(
                spans,
                &[&normed],
                |r| !m.regroups(spans[r].len(), rows_alone(r)),
                |parts, alone| m.forward(&parts[0], alone.is_none_or(rows_alone)),
            )?,
        };
        Ok((h.add(&r)?, selections))
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
    /// The global indices of `layers` (all unless a pipeline slice).
    range: Range<usize>,
    slice: Option<PipelineSlice>,
    /// The final norm and the head (absent on pipeline ranks other than 0).
    norm: Option<RmsNorm>,
    head: Option<Linear>,
    mtp: Vec<MtpRow>,
    capabilities: Capabilities,
    /// Per decoder layer: its latent cache's slot in the request's set and,
    /// for a full layer, its indexer cache's (the next slot).
    slots: Vec<(usize, Option<usize>)>,
    /// The routed experts' store when they stream from disk.
    experts: Option<Arc<ExpertStore>>,
    /// The MTP row's experts were asked to stay at these bits
    /// (`--mtp-expert-bits`).
    mtp_tier_bits: Option<i32>,
}

/// The MTP row's routed experts kept resident at 8 bits
/// (`--mtp-expert-bits`), apart from the streamed tier and never evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtpExpertTier {
    /// Bits per weight.
    pub bits: i32,
    /// Bytes the row's routed experts hold.
    pub resident_bytes: u64,
}

/// The keys an MTP draft round's first step picked (its last row's
/// selection) and its position, when `index_share_for_mtp_iteration` holds:
/// the later steps of the round attend to those keys plus every position
/// drafted since (`Model::mtp_draft_step`).
#[derive(Debug, Clone)]
pub struct MtpRoundSelection {
    /// `[1, 1, 1, k]` key positions, `None` when the context fit `index_topk`.
    picks: Option<Array>,
    /// The first step's position.
    first: usize,
}

/// The indexer tensors of a layer: any of them marks the MTP row's indexer
/// as present (a missing one is then a load error naming it).
const INDEXER_TENSORS: [&str; 4] = [
    "self_attn.indexer.wq_b.weight",
    "self_attn.indexer.wk.weight",
    "self_attn.indexer.k_norm.weight",
    "self_attn.indexer.weights_proj.weight",
];

/// The option that keeps the MTP row's experts at 8 bits (errors name it).
pub const MTP_EXPERT_BITS_OPTION: &str = "--mtp-expert-bits";

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
        Self::load_slice(dir, options, glm, None)
    }

    /// Loads one pipeline rank's layers (`None`: the whole model). The
    /// other ranks' layer tensors are discarded unread; only rank 0 reads
    /// the final norm, the head and the MTP row. Ranks start at full
    /// layers (`PipelineSlice::layers_aligned`): an IndexShare layer reuses
    /// the picks of the full layer before it, which stays on its rank.
    pub fn load_slice(
        dir: &Path,
        options: &LoadOptions,
        glm: GlmOptions,
        slice: Option<PipelineSlice>,
    ) -> Result<Self, ModelError> {
        let (file, path): (ConfigFile, PathBuf) = read_config(dir)?;
        let (config, ropes) = config::parse(file, &path)?;
        let mut w = Weights::from_dir(dir)?;
        // The adapter's names are mlx-lm's module paths (its model holds no
        // MTP row); a pipeline rank discards the other ranks' below.
        crate::adapter::apply_option(options, &mut w, config.layers)?;
        let experts = options
            .expert_cache_bytes
            .map(|bytes| ExpertStore::open(dir, bytes))
            .transpose()?;
        let c = &config;
        let head_here = slice.is_none_or(|s| s.holds_head());
        let range = match slice {
            Some(s) => {
                PipelineSlice::layers_aligned(s.rank(), s.size(), c.layers, |i| c.has_indexer(i))?
            }
            None => 0..c.layers,
        };
        let has_mtp_marker = w.contains(&mtp_marker(c.layers));
        // Other ranks' layers (and, off rank 0, the norm, head and MTP row)
        // by rule.
        w.discard_where(|name| {
            layer_of(name).is_some_and(|i| {
                if i < c.layers {
                    !range.contains(&i)
                } else {
                    !head_here
                }
            }) || (!head_here && (name.starts_with("model.norm.") || name.starts_with("lm_head.")))
        });
        let vb = w.view(&c.quantization, options.dtype);
        let embed = Embedding::load(&vb.pp("model.embed_tokens"), c.vocab, c.hidden)?;
        let total = range.len() + if head_here { c.nextn_layers } else { 0 };
        let rows = vb.pp("model.layers");
        let mut layers = Vec::with_capacity(range.len());
        for i in range.clone() {
            let _span = tracing::debug_span!("load_layer", layer = i).entered();
            let p = rows.pp(i);
            layout::to_mlx_layout(&p, c, experts.is_none())?;
            let source = match &experts {
                Some(store) => Experts::Streamed(store),
                None => Experts::Resident,
            };
            layers.push(DecoderLayer::load(&p, i, c, c.has_indexer(i), source)?);
            if let Some(progress) = &options.progress {
                progress(i + 1 - range.start, total);
            }
        }
        let (norm, head) = if head_here {
            (
                Some(RmsNorm::load(&vb.pp("model.norm"), c.hidden, c.eps)?),
                Some(Linear::load(&vb.pp("lm_head"), c.hidden, c.vocab, false)?),
            )
        } else {
            (None, None)
        };

        if c.nextn_layers == 0 && has_mtp_marker {
            return Err(ModelError::Config {
                path,
                message: format!("the checkpoint holds an MTP row (model.layers.{}.*) but num_nextn_predict_layers is 0 or missing", c.layers),
            });
        }
        let mtp_present = c.nextn_layers > 0 && has_mtp_marker;
        let mut mtp = Vec::new();
        let mtp_experts = match options.mtp_expert_bits {
            None => Experts::Resident,
            Some(8) => Experts::EightBit(MTP_EXPERT_BITS_OPTION),
            Some(bits) => {
                return Err(ModelError::LoadOption {
                    option: MTP_EXPERT_BITS_OPTION,
                    message: format!("{bits} bits: the MTP row's experts are kept at 8 bits only"),
                })
            }
        };
        if mtp_present && glm.load_mtp && head_here {
            for row in c.layers..c.layers + c.nextn_layers {
                let p = rows.pp(row);
                // The row's logits use the target's head: its embedding
                // copy and head copy (present in some exports) are unused.
                let unused = [p.name("embed_tokens."), p.name("shared_head.head.")];
                w.discard_where(|name| unused.iter().any(|u| name.starts_with(u.as_str())));
                let with_indexer = INDEXER_TENSORS.iter().any(|t| w.contains(&p.name(t)));
                // The row's experts stay resident (the target's traffic
                // must not evict them).
                layout::to_mlx_layout(&p, c, true)?;
                let (h, eps) = (c.hidden, c.eps);
                mtp.push(MtpRow {
                    enorm: RmsNorm::load(&p.pp("enorm"), h, eps)?,
                    hnorm: RmsNorm::load(&p.pp("hnorm"), h, eps)?,
                    eh_proj: Linear::load(&p.pp("eh_proj"), 2 * h, h, false)?,
                    layer: DecoderLayer::load(&p, row, c, with_indexer, mtp_experts)?,
                    shared_norm: RmsNorm::load(&p.pp("shared_head.norm"), h, eps)?,
                });
                if let Some(progress) = &options.progress {
                    progress(range.len() + row + 1 - c.layers, total);
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
        let mut slots = Vec::with_capacity(range.len());
        let mut next = 0;
        for i in range.clone() {
            let indexer = c.has_indexer(i).then_some(next + 1);
            slots.push((next, indexer));
            next += 1 + usize::from(indexer.is_some());
        }
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
            range,
            slice,
            norm,
            head,
            mtp,
            capabilities,
            slots,
            experts,
            mtp_tier_bits: options.mtp_expert_bits,
        })
    }

    /// The streamed experts' tier counters (`None`: experts resident).
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        self.experts.as_ref().map(|store| store.stats())
    }

    /// Bits of the MTP row's routed experts when kept quantized (8 with
    /// `--mtp-expert-bits 8`); `None` without the row, or dense.
    pub fn mtp_expert_bits(&self) -> Option<i32> {
        self.mtp.first().and_then(|row| match &row.layer.ffn {
            FeedForward::Moe(m) => m.expert_bits(),
            FeedForward::Dense(_) => None,
        })
    }

    /// The MTP row's expert tier (`--mtp-expert-bits`): its bits and the
    /// bytes its routed experts hold; `None` without the option or the row.
    pub fn mtp_expert_tier(&self) -> Option<MtpExpertTier> {
        let bits = self.mtp_tier_bits?;
        let mut resident_bytes = 0;
        for row in &self.mtp {
            if let FeedForward::Moe(m) = &row.layer.ffn {
                resident_bytes += m.expert_nbytes() as u64;
            }
        }
        (!self.mtp.is_empty()).then_some(MtpExpertTier {
            bits,
            resident_bytes,
        })
    }

    /// The streamed experts' store (`None`: experts resident).
    pub fn expert_store(&self) -> Option<&Arc<ExpertStore>> {
        self.experts.as_ref()
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

    /// An empty cache for the MTP row (with an indexer cache when the row
    /// has its own indexer).
    pub fn new_mtp_cache(&self) -> MtpCache {
        MtpCache::new(
            self.config.kv_lora_rank,
            self.config.qk_rope,
            self.mtp_has_indexer(),
        )
    }

    /// Whether the loaded MTP row runs its own DSA indexer.
    pub fn mtp_has_indexer(&self) -> bool {
        self.mtp.first().is_some_and(|r| r.layer.attn.has_indexer())
    }

    fn mtp_row(&self) -> Result<&MtpRow, ModelError> {
        self.mtp.first().ok_or_else(|| {
            ModelError::Spec(
                spec_core::InputError::NotLoaded {
                    part: "loaded MTP row",
                }
                .into(),
            )
        })
    }

    /// One pass of the MTP row over `L` (token, hidden) pairs: `tokens`
    /// `[1, L]` are the next tokens, `hidden` `[1, L, H]` the hidden states
    /// that predicted them. Appends `L` rows to `cache`; returns the row's
    /// output `[1, L, H]` (before `shared_head.norm`: the next step's hidden).
    /// The row's own indexer (if any) selects the keys of every row.
    pub fn mtp_forward(
        &self,
        tokens: &Array,
        hidden: &Array,
        cache: &mut MtpCache,
    ) -> Result<Array, ModelError> {
        Ok(self.mtp_run(tokens, hidden, cache, None)?.0)
    }

    /// One MTP draft step (`token` `[1, 1]`, `hidden` `[1, 1, H]`).
    /// `round` starts each draft round as `None`. With
    /// `index_share_for_mtp_iteration` and an MTP indexer, the first step
    /// runs the indexer and records its picks in `round`; every later step
    /// of the round skips the selection (its keys still enter the indexer
    /// cache) and attends to those picks plus the positions drafted since
    /// the first step, its own included. vLLM reuses the first step's
    /// selection alone; adding the drafted positions is our choice, so that a
    /// step sees its own key and its predecessors' (the same whenever the
    /// first step was dense). Otherwise every step is `mtp_forward`.
    pub fn mtp_draft_step(
        &self,
        token: &Array,
        hidden: &Array,
        cache: &mut MtpCache,
        round: &mut Option<MtpRoundSelection>,
    ) -> Result<Array, ModelError> {
        if !(self.config.index_share_for_mtp && cache.has_indexer()) {
            return self.mtp_forward(token, hidden, cache);
        }
        if token.shape() != [1, 1] {
            return Err(ModelError::Spec(
                spec_core::InputError::shape("an MTP draft step's token", "[1, 1]", token.shape())
                    .into(),
            ));
        }
        let position = cache.offset();
        let Some(shared) = round else {
            let (out, selection) = self.mtp_run(token, hidden, cache, None)?;
            let picks = match selection {
                Some(Selection::Rows(mut rows)) if rows.len() == 1 => rows.remove(0),
                other => {
                    tracing::error!(selection = ?other, "the MTP indexer's selection for one row");
                    return Err(ModelError::Spec(SpecError::Internal(
                        "the MTP indexer did not return one row's selection",
                    )));
                }
            };
            *round = Some(MtpRoundSelection {
                picks,
                first: position,
            });
            return Ok(out);
        };
        let picks = match &shared.picks {
            None => None,
            Some(picks) => {
                let drafted: Vec<u32> = (shared.first + 1..=position)
                    .map(|p| u32::try_from(p).unwrap_or(u32::MAX))
                    .collect();
                let drafted = Array::from_slice(&drafted, &[1, 1, 1, drafted.len() as i32])
                    .as_dtype(picks.dtype())?;
                Some(concatenate(&[picks.clone(), drafted], -1)?)
            }
        };
        Ok(self
            .mtp_run(token, hidden, cache, Some(&Selection::Rows(vec![picks])))?
            .0)
    }

    fn mtp_run(
        &self,
        tokens: &Array,
        hidden: &Array,
        cache: &mut MtpCache,
        reuse: Option<&Selection>,
    ) -> Result<(Array, Option<Selection>), ModelError> {
        let row = self.mtp_row()?;
        if cache.geometry() != (self.config.kv_lora_rank, self.config.qk_rope)
            || cache.has_indexer() != row.layer.attn.has_indexer()
            || !cache.aligned()
        {
            return Err(ModelError::Spec(
                spec_core::InputError::ForeignCache(format!(
                    "not an MTP cache of this model: geometry {:?}, indexer cache {}",
                    cache.geometry(),
                    cache.has_indexer()
                ))
                .into(),
            ));
        }
        let l = tokens.shape().get(1).copied().unwrap_or(0);
        if tokens.ndim() != 2 || hidden.shape() != [1, l, self.config.hidden] || l == 0 {
            return Err(ModelError::Spec(
                spec_core::InputError::shapes(
                    "MTP pairs' tokens and hidden states",
                    format!("[1, L] and [1, L, {}] with L > 0", self.config.hidden),
                    tokens.shape(),
                    hidden.shape(),
                )
                .into(),
            ));
        }
        let e = row.enorm.forward(&self.embed.forward(tokens)?)?;
        let h = row.hnorm.forward(hidden)?;
        let x = row.eh_proj.forward(&concatenate(&[e, h], -1)?)?;
        let mode = RowMode {
            mask: causal_mask(l as usize, cache.offset())?,
            rows_alone: false,
        };
        let whole: Vec<Range<usize>> = std::iter::once(0..l as usize).collect();
        let (out, mut selections) = row.layer.forward(
            &x,
            &whole,
            &mut [LayerCaches::Mtp(cache)],
            &[mode],
            &[reuse],
            &self.ropes,
        )?;
        Ok((out, selections.pop().flatten()))
    }

    /// Logits of MTP outputs: `shared_head.norm`, then the target's head.
    pub fn mtp_logits(&self, out: &Array) -> Result<Array, ModelError> {
        let normed = self.mtp_row()?.shared_norm.forward(out)?;
        self.head()?.forward(&normed)
    }

    fn head(&self) -> Result<&Linear, ModelError> {
        self.head.as_ref().ok_or_else(|| self.partial().into())
    }

    fn partial(&self) -> SpecError {
        match self.slice {
            Some(s) => partial_forward(s, &self.range, self.config.layers),
            None => spec_core::InputError::NotLoaded { part: "head" }.into(),
        }
    }

    /// Bytes of all weights, as held in memory.
    pub fn weights_bytes(&self) -> usize {
        self.layers.iter().map(DecoderLayer::nbytes).sum::<usize>()
            + self.embed.nbytes()
            + self.norm.as_ref().map_or(0, RmsNorm::nbytes)
            + self.head.as_ref().map_or(0, Linear::nbytes)
            + self.mtp_weights_bytes()
    }
}

impl Model {
    /// The target forward over packed rows: post-norm hidden states and
    /// taps, `[B, T, ..]`. Prefill rows take mlx-lm's window form, decoding
    /// rows the single-query form (`RowMode::rows_alone`).
    fn run(
        &self,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Option<Array>), SpecError> {
        let (Some(norm), None) = (&self.norm, self.slice.filter(|s| s.size() > 1)) else {
            return Err(self.partial());
        };
        let layers = self.layers.len();
        self.check(packed, taps, layers)?;
        let h = self.embed.forward(&packed.ids)?;
        let (h, tapped) = self.run_layers(h, packed, taps)?;
        Ok((norm.forward(&h)?, concat_taps(taps, &tapped)?))
    }

    /// Checks the rows' cache counts and `taps` against `tap_limit`.
    fn check(
        &self,
        packed: &Packed<'_>,
        taps: &[usize],
        tap_limit: usize,
    ) -> Result<(), SpecError> {
        let expected = self.slots.last().map_or(0, |(l, i)| i.unwrap_or(*l) + 1);
        let layers = self.layers.len();
        packed.check(
            expected,
            layers,
            "a latent cache per layer, an indexer cache per full layer",
            taps,
            tap_limit,
        )
    }

    /// The held layers over packed rows from `h`: the last layer's output
    /// and the outputs of the held layers listed in `taps` (global indices).
    fn run_layers(
        &self,
        mut h: Array,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Vec<(usize, Array)>), SpecError> {
        let mut modes = Vec::with_capacity(packed.rows.len());
        for (row, span) in packed.rows.iter().zip(&packed.spans) {
            modes.push(RowMode {
                mask: causal_mask(span.len(), row.caches.offset())?,
                rows_alone: row.form == RowForm::Decode,
            });
        }
        let mut tapped = Vec::with_capacity(taps.len());
        // Per row, the last full layer's picks, reused by the shared layers
        // after it.
        let mut picked: Vec<Option<Selection>> = vec![None; packed.rows.len()];
        for (local, (layer, &(latent, indexer))) in self.layers.iter().zip(&self.slots).enumerate()
        {
            let reuse: Vec<Option<&Selection>> = if indexer.is_some() {
                vec![None; picked.len()]
            } else {
                picked.iter().map(Option::as_ref).collect()
            };
            let mut caches: Vec<LayerCaches<'_>> = packed
                .rows
                .iter_mut()
                .map(|row| LayerCaches::Target {
                    set: &mut *row.caches,
                    latent,
                    indexer,
                })
                .collect();
            let (out, selections) =
                layer.forward(&h, &packed.spans, &mut caches, &modes, &reuse, &self.ropes)?;
            h = out;
            if indexer.is_some() {
                picked = selections;
            }
            let i = self.range.start + local;
            if taps.contains(&i) {
                tapped.push((i, h.clone()));
            }
        }
        Ok((h, tapped))
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
    /// Each decoding row as a single query: the absorbed latent and the
    /// indexer's picks per row, as mlx-lm computes one query (its
    /// several-query form rounds differently).
    const DECODE_FORM: RowForm = RowForm::Decode;
    /// GLM's prefill chunks are not split-invariant.
    fn split_invariant(&self) -> bool {
        false
    }

    fn target_info(&self) -> &TargetInfo {
        &self.info
    }

    fn fresh_caches(&self) -> CacheSet {
        let c = &self.config;
        let mut caches: Vec<Box<dyn LayerCache>> = Vec::with_capacity(2 * self.layers.len());
        for (_, indexer) in &self.slots {
            caches.push(Box::new(MlaCache::new(
                MlaRole::Target,
                c.kv_lora_rank,
                c.qk_rope,
            )));
            if indexer.is_some() {
                caches.push(Box::new(IndexerCache::new()));
            }
        }
        CacheSet::new(caches)
    }

    fn head_logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        Ok(self.head()?.forward(hidden)?)
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

    fn held_layers(&self) -> Range<usize> {
        self.range.clone()
    }

    fn layers_of_rank(&self, rank: usize, size: usize) -> Result<Range<usize>, ModelError> {
        let c = &self.config;
        PipelineSlice::layers_aligned(rank, size, c.layers, |i| c.has_indexer(i))
    }

    fn check_stage(&self, packed: &Packed<'_>) -> Result<(), SpecError> {
        self.check(packed, &[], 1)
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
