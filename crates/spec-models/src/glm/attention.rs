//! Multi-head latent attention with the DSA indexer, in mlx-lm's
//! `deepseek_v32` op order: the cache keeps the normalised latent and the
//! rotated rope key (`[B, 1, T, kv_lora_rank]`, `[B, 1, T, qk_rope]`); a
//! single query absorbs `embed_q` / `unembed_out` into the latent space,
//! several queries expand the latent into per-head keys and values. Once the
//! context exceeds `index_topk`, the indexer picks the keys each query sees.
//! A layer without an indexer (GLM-5.2's "shared" layers) attends to the
//! keys the previous full layer picked (`Selection`).

use crate::sdpa::{self, Mask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, broadcast_to, concatenate, maximum, select, zeros_dtype};
use mlx_rs::{Array, Dtype};
use spec_core::{CacheSet, LayerCache};

use std::ops::Range;

use super::cache::MtpCache;

use super::config::{Config, Ropes};
use crate::batch::{self, Packed};
use crate::layers::{Linear, RmsNorm};
use crate::rope::Rope;
use crate::stacked::Stacked;
use crate::weights::WeightsView;
use crate::ModelError;

/// mlx-lm hard-codes this epsilon for the two low-rank norms.
const LORA_NORM_EPS: f32 = 1e-6;

/// The caches one layer writes: a target layer's latent cache and, for a
/// layer with its own indexer, the indexer's (slots of the request's set, as
/// mlx-lm's `CacheList`; `Model::slots` maps layers to them), or the MTP
/// row's caches.
#[derive(Debug)]
pub(super) enum LayerCaches<'a> {
    Target {
        set: &'a mut CacheSet,
        latent: usize,
        indexer: Option<usize>,
    },
    Mtp(&'a mut MtpCache),
}

/// The keys each query of one forward attends to, as a full layer's indexer
/// picked them; layers without an indexer reuse it (IndexShare).
#[derive(Debug, Clone)]
pub(super) enum Selection {
    /// The single-query form: per query row, `[B, 1, 1, k]` key positions,
    /// or `None` (dense: the context fits `index_topk`).
    Rows(Vec<Option<Array>>),
    /// The window form: `[B, 1, L, topk]` key positions, or `None` (dense).
    Window(Option<Array>),
}

fn mismatched(what: &str) -> ModelError {
    ModelError::Spec(
        spec_core::InputError::ForeignCache(format!("a shared DSA layer was handed {what}")).into(),
    )
}

fn slot(set: &mut CacheSet, index: usize) -> Result<&mut (dyn LayerCache + 'static), ModelError> {
    let len = set.len();
    set.get_mut(index).ok_or_else(|| {
        ModelError::Spec(spec_core::InputError::CacheSlot { slot: index, len }.into())
    })
}

impl LayerCaches<'_> {
    fn latent(&mut self) -> Result<&mut dyn LayerCache, ModelError> {
        match self {
            LayerCaches::Target { set, latent, .. } => Ok(slot(set, *latent)?),
            LayerCaches::Mtp(cache) => Ok(cache.parts().0),
        }
    }

    fn indexer(&mut self) -> Result<Option<&mut dyn LayerCache>, ModelError> {
        match self {
            LayerCaches::Target {
                set,
                indexer: Some(i),
                ..
            } => Ok(Some(slot(set, *i)?)),
            LayerCaches::Target { indexer: None, .. } => Ok(None),
            LayerCaches::Mtp(cache) => Ok(cache.parts().1.map(|c| -> &mut dyn LayerCache { c })),
        }
    }
}

/// A scalar in `like`'s dtype: Python scalars in mlx-lm are weakly typed,
/// so a bfloat16 tensor times `0.5` stays bfloat16.
fn scalar(value: f32, like: &Array) -> Result<Array, ModelError> {
    Ok(Array::from_f32(value).as_dtype(like.dtype())?)
}

/// `mx.finfo(dtype).min` as a scalar of that dtype.
fn lowest(like: &Array) -> Result<Array, ModelError> {
    let value = match like.dtype() {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    };
    scalar(value, like)
}

/// `nn.LayerNorm` with weight and bias.
#[derive(Debug)]
struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    fn load(vb: &WeightsView<'_>, dim: i32, eps: f32) -> Result<Self, ModelError> {
        Ok(Self {
            weight: vb.take_cast("weight", &[dim])?,
            bias: vb.take_cast("bias", &[dim])?,
            eps,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array, ModelError> {
        Ok(mlx_rs::fast::layer_norm(
            x,
            &self.weight,
            &self.bias,
            self.eps,
        )?)
    }

    fn nbytes(&self) -> usize {
        self.weight.nbytes() + self.bias.nbytes()
    }
}

/// The DSA lightning indexer: scores every cached key per query and keeps
/// the `topk` best.
#[derive(Debug)]
struct Indexer {
    wq_b: Linear,
    wk: Linear,
    k_norm: LayerNorm,
    weights_proj: Linear,
    heads: i32,
    head_dim: i32,
    topk: usize,
    /// `heads^-0.5 * head_dim^-0.5`, computed in double as mlx-lm does.
    weight_scale: f32,
}

impl Indexer {
    fn load(vb: &WeightsView<'_>, c: &Config) -> Result<Self, ModelError> {
        let (heads, hd) = (c.index_heads, c.index_head_dim);
        Ok(Self {
            wq_b: Linear::load(&vb.pp("wq_b"), c.q_lora_rank, heads * hd, false)?,
            wk: Linear::load(&vb.pp("wk"), c.hidden, hd, false)?,
            k_norm: LayerNorm::load(&vb.pp("k_norm"), hd, c.indexer_norm_eps)?,
            weights_proj: Linear::load(&vb.pp("weights_proj"), c.hidden, heads, false)?,
            heads,
            head_dim: hd,
            topk: c.index_topk,
            weight_scale: (f64::from(heads).powf(-0.5) * f64::from(hd).powf(-0.5)) as f32,
        })
    }

    fn nbytes(&self) -> usize {
        self.wq_b.nbytes() + self.wk.nbytes() + self.k_norm.nbytes() + self.weights_proj.nbytes()
    }

    /// This window's indexer queries `[B, T, heads, D]`, keys `[B, T, D]`
    /// and head weights `[B, T, heads]` (scaled), token by token.
    fn project(&self, x: &Array, qr: &Array) -> Result<IndexerInputs, ModelError> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let q = self
            .wq_b
            .forward(qr)?
            .reshape(&[b, t, self.heads, self.head_dim])?;
        let k = self.k_norm.forward(&self.wk.forward(x)?)?;
        let weights = self.weights_proj.forward(x)?;
        let weights = weights.multiply(scalar(self.weight_scale, &weights)?)?;
        Ok(IndexerInputs { q, k, weights })
    }

    /// Rotates one row's queries and keys (its slices of `IndexerInputs`)
    /// and appends the keys to `cache`; returns the queries `[B, heads, L,
    /// D]` and every cached key `[B, 1, T, D]`.
    fn append(
        &self,
        q: &Array,
        k: &Array,
        rope: &Rope,
        cache: &mut dyn LayerCache,
    ) -> Result<(Array, Array), ModelError> {
        let (b, s) = (k.shape()[0], k.shape()[1]);
        let q = q.swap_axes(1, 2)?;
        let k = k.reshape(&[b, 1, s, self.head_dim])?;
        let offset = cache.offset();
        let q = rope.apply(&q, offset)?;
        let k = rope.apply(&k, offset)?;
        let (k, _) = cache.update_and_fetch(&k, &k)?;
        if k.shape()[2] <= self.topk as i32 {
            // Nothing reads the keys yet; without this their lazy buffer
            // updates would chain up request-long (mlx-lm ties them to the
            // latent cache with `mx.depends` for the same reason).
            mlx_rs::transforms::async_eval([&k])?;
        }
        Ok((q, k))
    }

    /// The `topk` keys each query sees (`[B, 1, L, topk]`), from its rotated
    /// queries `q`, the keys `k` and the head weights `weights` (`[B, L,
    /// heads]`); `None` while every key fits.
    fn select(
        &self,
        weights: &Array,
        q: &Array,
        k: &Array,
        mask: Option<&Array>,
    ) -> Result<Option<Array>, ModelError> {
        let s = weights.shape()[1];
        let topk = self.topk as i32;
        if k.shape()[2] <= topk {
            return Ok(None);
        }
        let scores = q.matmul(k.swap_axes(-1, -2)?)?;
        let scores = maximum(&scores, scalar(0.0, &scores)?)?;
        let scores = scores.multiply(weights.swap_axes(-1, -2)?.expand_dims(-1)?)?;
        // mlx-lm sums the heads one by one for several queries (a Python
        // `sum`, starting from 0) and with one reduction for a single query.
        let scores = if s > 1 {
            let mut acc = scalar(0.0, &scores)?;
            for h in 0..self.heads {
                acc = acc.add(scores.index((.., h..h + 1, .., ..)))?;
            }
            acc
        } else {
            scores.sum_axis(1, true)?
        };
        let scores = match mask {
            Some(m) => select(m, &scores, scalar(f32::NEG_INFINITY, &scores)?)?,
            None => scores,
        };
        Ok(Some(argpartition_axis(&scores, -topk, -1)?.index((
            ..,
            ..,
            ..,
            -topk..,
        ))))
    }
}

/// The indexer's token-by-token projections of a packed window.
#[derive(Debug)]
struct IndexerInputs {
    q: Array,
    k: Array,
    weights: Array,
}

/// How one row of a forward is computed.
#[derive(Debug, Clone)]
pub(super) struct RowMode {
    /// The row's causal mask (`None` for a single query).
    pub mask: Option<Array>,
    /// Every query computed as a single query would be (decoding rows).
    pub rows_alone: bool,
}

/// The token-by-token projections of a packed window, `[B, T, ..]`.
#[derive(Debug)]
struct Projected {
    q_nope: Array,
    q_pe: Array,
    k_pe: Array,
    kv_latent: Array,
    indexer: Option<IndexerInputs>,
}

/// MLA attention of one layer.
#[derive(Debug)]
pub(super) struct Attention {
    q_a: Linear,
    q_a_norm: RmsNorm,
    q_b: Linear,
    kv_a: Linear,
    kv_a_norm: RmsNorm,
    embed_q: Stacked,
    unembed_out: Stacked,
    o: Linear,
    indexer: Option<Indexer>,
    heads: i32,
    qk_nope: i32,
    qk_rope: i32,
    kv_lora: i32,
    scale: f32,
}

impl Attention {
    /// Loads the attention `vb` reads; `with_indexer` false for the MTP row
    /// (dense attention; its indexer tensors, if any, are discarded by the
    /// caller).
    pub fn load(vb: &WeightsView<'_>, c: &Config, with_indexer: bool) -> Result<Self, ModelError> {
        let bias = c.attention_bias;
        let q_head = c.qk_nope + c.qk_rope;
        let (h, ql, kvl) = (c.hidden, c.q_lora_rank, c.kv_lora_rank);
        Ok(Self {
            q_a: Linear::load(&vb.pp("q_a_proj"), h, ql, bias)?,
            q_a_norm: RmsNorm::load(&vb.pp("q_a_layernorm"), ql, LORA_NORM_EPS)?,
            q_b: Linear::load(&vb.pp("q_b_proj"), ql, c.heads * q_head, false)?,
            kv_a: Linear::load(&vb.pp("kv_a_proj_with_mqa"), h, kvl + c.qk_rope, bias)?,
            kv_a_norm: RmsNorm::load(&vb.pp("kv_a_layernorm"), kvl, LORA_NORM_EPS)?,
            embed_q: Stacked::load(&vb.pp("embed_q"), c.heads, kvl, c.qk_nope)?,
            unembed_out: Stacked::load(&vb.pp("unembed_out"), c.heads, c.v_head, kvl)?,
            o: Linear::load(&vb.pp("o_proj"), c.heads * c.v_head, h, bias)?,
            indexer: if with_indexer {
                Some(Indexer::load(&vb.pp("indexer"), c)?)
            } else {
                None
            },
            heads: c.heads,
            qk_nope: c.qk_nope,
            qk_rope: c.qk_rope,
            kv_lora: c.kv_lora_rank,
            scale: c.scale,
        })
    }

    pub fn nbytes(&self) -> usize {
        self.q_a.nbytes()
            + self.q_a_norm.nbytes()
            + self.q_b.nbytes()
            + self.kv_a.nbytes()
            + self.kv_a_norm.nbytes()
            + self.embed_q.nbytes()
            + self.unembed_out.nbytes()
            + self.o.nbytes()
            + self.indexer.as_ref().map_or(0, Indexer::nbytes)
    }

    /// Whether this layer runs its own indexer.
    pub fn has_indexer(&self) -> bool {
        self.indexer.is_some()
    }

    /// Attention over the packed rows `x` (`[B, T, hidden]`, row `r` at
    /// `spans[r]`): the projections over every token at once, then each row
    /// over its own caches (`caches[r]`) in its own form (`modes[r]`), the
    /// output projection over every token again. `rows_alone`: compute each
    /// query as a single query would be (decoding rows: a verify window
    /// gives every row the bits it gets alone); otherwise `L > 1` queries
    /// take mlx-lm's prefill form (expanded latent, a mask for the indexer's
    /// picks).
    ///
    /// `reuse[r]`: the keys row `r` attends to, picked earlier (a shared
    /// layer gets the previous full layer's selection; the MTP row's later
    /// draft steps get the first step's). A layer with an indexer still
    /// appends the window's keys to its indexer cache then, so that cache
    /// keeps the latent cache's positions. Returns the output and each
    /// row's selection (`None` for a layer without indexer and nothing to
    /// reuse: dense).
    pub fn forward(
        &self,
        x: &Array,
        spans: &[Range<usize>],
        caches: &mut [LayerCaches<'_>],
        modes: &[RowMode],
        reuse: &[Option<&Selection>],
        ropes: &Ropes,
    ) -> Result<(Array, Vec<Option<Selection>>), ModelError> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let qr = self.q_a_norm.forward(&self.q_a.forward(x)?)?;
        let q = self
            .q_b
            .forward(&qr)?
            .reshape(&[b, t, self.heads, self.qk_nope + self.qk_rope])?;
        let q_parts = q.split_at_indices(&[self.qk_nope], -1)?;
        let kv = self.kv_a.forward(x)?;
        let kv_parts = kv.split_at_indices(&[self.kv_lora], -1)?;
        let projected = Projected {
            q_nope: q_parts[0].clone(),
            q_pe: q_parts[1].clone(),
            k_pe: kv_parts[1].reshape(&[b, t, 1, self.qk_rope])?,
            kv_latent: self.kv_a_norm.forward(&kv_parts[0])?,
            indexer: match &self.indexer {
                Some(indexer) => Some(indexer.project(x, &qr)?),
                None => None,
            },
        };
        if caches.len() != spans.len() || modes.len() != spans.len() {
            let (what, got) = if caches.len() != spans.len() {
                ("cache sets of an MLA layer's rows", caches.len())
            } else {
                ("modes of an MLA layer's rows", modes.len())
            };
            return Err(ModelError::Spec(
                spec_core::InputError::Count {
                    what,
                    expected: spans.len(),
                    got,
                }
                .into(),
            ));
        }
        let mut outs = Vec::with_capacity(spans.len());
        let mut selections = Vec::with_capacity(spans.len());
        for (r, (row_caches, mode)) in caches.iter_mut().zip(modes).enumerate() {
            let reuse = reuse.get(r).copied().flatten();
            let (out, selection) =
                self.attend_row(&projected, spans, r, row_caches, mode, reuse, ropes)?;
            outs.push(out);
            selections.push(selection);
        }
        Ok((self.o.forward(&Packed::join(outs)?)?, selections))
    }

    /// Row `r` of a packed window: RoPE at the row's offset, its caches'
    /// updates, its indexer's picks and its attention; `[B, L, heads * v]`.
    #[allow(clippy::too_many_arguments)]
    fn attend_row(
        &self,
        p: &Projected,
        spans: &[Range<usize>],
        r: usize,
        caches: &mut LayerCaches<'_>,
        mode: &RowMode,
        reuse: Option<&Selection>,
        ropes: &Ropes,
    ) -> Result<(Array, Option<Selection>), ModelError> {
        let row = |a: &Array| batch::slice(spans, a, r);
        let heads_first =
            |a: &Array| -> Result<Array, ModelError> { Ok(row(a)?.transpose_axes(&[0, 2, 1, 3])?) };
        let (q_nope, q_pe, k_pe) = (
            heads_first(&p.q_nope)?,
            heads_first(&p.q_pe)?,
            heads_first(&p.k_pe)?,
        );
        let kv_latent = row(&p.kv_latent)?;
        let x_rows = kv_latent.shape()[..2].to_vec();
        let (b, l) = (x_rows[0], x_rows[1]);

        let latent_cache = caches.latent()?;
        let offset = latent_cache.offset();
        let q_pe = ropes.attention.apply(&q_pe, offset)?;
        let k_pe = ropes.attention.apply(&k_pe, offset)?;
        let (kv_latent, k_pe) = latent_cache.update_and_fetch(&kv_latent.expand_dims(1)?, &k_pe)?;

        let indexed = match (&self.indexer, &p.indexer, caches.indexer()?) {
            (Some(indexer), Some(inputs), Some(cache)) => {
                let (iq, ik) =
                    indexer.append(&row(&inputs.q)?, &row(&inputs.k)?, &ropes.indexer, cache)?;
                Some((indexer, row(&inputs.weights)?, (iq, ik)))
            }
            (Some(_), _, None) => {
                return Err(ModelError::Spec(
                    spec_core::InputError::ForeignCache(
                        "a DSA layer needs its indexer cache".into(),
                    )
                    .into(),
                ))
            }
            _ => None,
        };
        let (out, selection) = if l == 1 || mode.rows_alone {
            let mut picks = Vec::with_capacity(l as usize);
            let mut rows = Vec::with_capacity(l as usize);
            for j in 0..l {
                // Query `j` sees the keys up to its own position, exactly as
                // it would as the only query of a forward.
                let end = offset as i32 + j + 1;
                let one = |a: &Array| a.index((.., .., j..j + 1, ..));
                let topk = match (reuse, &indexed) {
                    (Some(Selection::Rows(given)), _) => given
                        .get(j as usize)
                        .cloned()
                        .ok_or_else(|| mismatched("fewer rows than it has"))?,
                    (Some(Selection::Window(_)), _) => {
                        return Err(mismatched("a window selection in the single-query form"))
                    }
                    (None, Some((indexer, weights, (iq, ik)))) => indexer.select(
                        &weights.index((.., j..j + 1, ..)),
                        &one(iq),
                        &ik.index((.., .., ..end, ..)),
                        None,
                    )?,
                    (None, None) => None,
                };
                let keys = (
                    kv_latent.index((.., .., ..end, ..)),
                    k_pe.index((.., .., ..end, ..)),
                );
                rows.push(self.attend_alone(&one(&q_nope), &one(&q_pe), keys, topk.as_ref())?);
                picks.push(topk);
            }
            let out = if rows.len() == 1 {
                rows.remove(0)
            } else {
                concatenate(&rows, 2)?
            };
            (out, Selection::Rows(picks))
        } else {
            let mask = mode.mask.as_ref();
            let topk = match (reuse, &indexed) {
                (Some(Selection::Window(given)), _) => given.clone(),
                (Some(Selection::Rows(_)), _) => {
                    return Err(mismatched("a single-query selection in the window form"))
                }
                (None, Some((indexer, weights, (iq, ik)))) => {
                    indexer.select(weights, iq, ik, mask)?
                }
                (None, None) => None,
            };
            let out = self.attend_window(&q_nope, &q_pe, kv_latent, k_pe, mask, topk.as_ref())?;
            (out, Selection::Window(topk))
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        let selection = (reuse.is_some() || indexed.is_some()).then_some(selection);
        Ok((out, selection))
    }

    /// One query (`[B, heads, 1, ..]`) over its keys: the indexer's picks
    /// gathered in its order, the latent absorbed (mlx-lm's single-query form).
    fn attend_alone(
        &self,
        q_nope: &Array,
        q_pe: &Array,
        keys: (Array, Array),
        topk: Option<&Array>,
    ) -> Result<Array, ModelError> {
        let (mut kv_latent, mut k_pe) = keys;
        if let Some(topk) = topk {
            let idx = topk.index((.., .., 0, ..)).expand_dims(-1)?;
            let mut shape = idx.shape().to_vec();
            let last = shape.len() - 1;
            shape[last] = kv_latent.shape()[3];
            kv_latent = kv_latent.take_along_axis(broadcast_to(&idx, &shape)?, 2)?;
            shape[last] = k_pe.shape()[3];
            k_pe = k_pe.take_along_axis(broadcast_to(&idx, &shape)?, 2)?;
        }
        let pe_scores = q_pe
            .multiply(scalar(self.scale, q_pe)?)?
            .matmul(k_pe.swap_axes(-1, -2)?)?;
        let q_latent = self.embed_q.per_head(q_nope, true)?;
        let o = sdpa::attention(
            &q_latent,
            &kv_latent,
            &kv_latent,
            self.scale,
            Mask::Array(&pe_scores),
        )?;
        self.unembed_out.per_head(&o, true)
    }

    /// Several queries at once, mlx-lm's prefill form: the indexer's picks
    /// `topk` as a mask, the latent expanded into per-head keys and values.
    fn attend_window(
        &self,
        q_nope: &Array,
        q_pe: &Array,
        kv_latent: Array,
        k_pe: Array,
        mask: Option<&Array>,
        topk: Option<&Array>,
    ) -> Result<Array, ModelError> {
        let mut mask = mask.cloned();
        if let Some(topk) = topk {
            let mut shape = topk.shape().to_vec();
            let last = shape.len() - 1;
            shape[last] = kv_latent.shape()[2];
            let sparse = zeros_dtype(&shape, Dtype::Bool)?.put_along_axis(
                topk,
                Array::from_bool(true),
                -1,
            )?;
            mask = Some(match mask {
                Some(m) => sparse.logical_and(&m)?,
                None => sparse,
            });
        }
        let pe_scores = q_pe
            .multiply(scalar(self.scale, q_pe)?)?
            .matmul(k_pe.swap_axes(-1, -2)?)?;
        let pe_scores = match &mask {
            Some(m) => select(m, &pe_scores, lowest(&pe_scores)?)?,
            None => pe_scores,
        };
        let k = self.embed_q.per_head(&kv_latent, false)?;
        let v = self.unembed_out.per_head(&kv_latent, true)?;
        sdpa::attention(q_nope, &k, &v, self.scale, Mask::Array(&pe_scores))
    }
}
