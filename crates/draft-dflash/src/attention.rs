//! A DFlash layer's attention: the block's queries over the projected
//! context's keys and values followed by the block's own, Qwen3-style
//! (`q_norm` / `k_norm`, RoPE from the anchor's position).
//!
//! Full layers see the whole context and the whole block (no mask), or the
//! block causally where `is_causal` is `true`. Sliding layers
//! (`sliding_attention`) see the last `sliding_window - 1` context rows at
//! most, and block query `i` sees context row `j` only when it is less than
//! `sliding_window` positions back; the block part is causal unless
//! `is_causal` is `false`. That is `model_mlx.py`'s mask over
//! the rows its rotating cache returns, which are those rows in time order
//! as long as the context fits its window (and on the first block after any
//! prefill); past that its cache hands them back in slot order, which
//! depends on the history of its updates, and we keep the time order of
//! the torch reference (`dflash/model.py`'s mask over the whole history).

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_runtime::layers::{Linear, RmsNorm};
use spec_runtime::rope::Rope;
use spec_runtime::weights::WeightsView;

use crate::config::DFlashConfig;
use crate::DFlashError;

/// How a layer's block queries see the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Span {
    /// Every context row; every block position, or the block causally.
    Full { causal: bool },
    /// The sliding window; the block causal or not.
    Sliding { window: usize, causal: bool },
}

#[derive(Debug)]
pub(crate) struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    span: Span,
}

impl Attention {
    pub(crate) fn load(
        vb: &WeightsView<'_>,
        c: &DFlashConfig,
        layer: usize,
    ) -> Result<Self, DFlashError> {
        let (qd, kd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let causal = c.causal(layer);
        let span = match (c.sliding.get(layer), c.sliding_window) {
            (Some(true), Some(window)) => Span::Sliding { window, causal },
            _ => Span::Full { causal },
        };
        Ok(Self {
            q: Linear::load(&vb.pp("q_proj"), c.hidden, qd, false)?,
            k: Linear::load(&vb.pp("k_proj"), c.hidden, kd, false)?,
            v: Linear::load(&vb.pp("v_proj"), c.hidden, kd, false)?,
            o: Linear::load(&vb.pp("o_proj"), qd, c.hidden, false)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), c.head_dim, c.eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), c.head_dim, c.eps)?,
            span,
        })
    }

    pub(crate) fn nbytes(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .map(|l| l.nbytes())
            .sum::<usize>()
            + self.q_norm.nbytes()
            + self.k_norm.nbytes()
    }

    /// Keys `[1, kv_heads, L, D]` (normed, rotated from `offset`) and values
    /// of `x` `[1, L, H]`.
    pub(crate) fn keys_values(
        &self,
        x: &Array,
        c: &DFlashConfig,
        rope: &Rope,
        offset: usize,
    ) -> Result<(Array, Array), DFlashError> {
        let l = x.shape()[1];
        let k = self
            .k
            .forward(x)?
            .reshape(&[1, l, c.kv_heads, c.head_dim])?;
        let keys = rope.apply(
            &self.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?,
            offset,
        )?;
        let values = self
            .v
            .forward(x)?
            .reshape(&[1, l, c.kv_heads, c.head_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        Ok((keys, values))
    }

    /// The block `x` `[1, L, H]` at positions `offset ..` over the context
    /// `ctx` (`offset` rows, `None` when empty).
    pub(crate) fn forward(
        &self,
        x: &Array,
        c: &DFlashConfig,
        rope: &Rope,
        ctx: Option<&(Array, Array)>,
        offset: usize,
    ) -> Result<Array, DFlashError> {
        let l = x.shape()[1];
        let queries = self
            .q_norm
            .forward(&self.q.forward(x)?.reshape(&[1, l, c.heads, c.head_dim])?)?
            .transpose_axes(&[0, 2, 1, 3])?;
        let queries = rope.apply(&queries, offset)?;
        let (keys, values) = self.keys_values(x, c, rope, offset)?;
        let kept = match self.span {
            Span::Full { .. } => offset,
            Span::Sliding { window, .. } => offset.min(window - 1),
        };
        let (keys, values) = match ctx.filter(|_| kept > 0) {
            Some((k0, v0)) => {
                let from = (offset - kept) as i32;
                let k0 = k0.index((.., .., from.., ..));
                let v0 = v0.index((.., .., from.., ..));
                (
                    concatenate(&[&k0, &keys], 2)?,
                    concatenate(&[&v0, &values], 2)?,
                )
            }
            None => (keys, values),
        };
        let scale = f64::from(c.head_dim).powf(-0.5) as f32;
        let mask = match self.span {
            Span::Full { causal: false } => None,
            Span::Full { causal: true } => Some(block_mask(kept, l as usize, None, true)?),
            Span::Sliding { window, causal } => {
                Some(block_mask(kept, l as usize, Some(window), causal)?)
            }
        };
        let out = mlx_rs::fast::scaled_dot_product_attention(
            &queries,
            &keys,
            &values,
            scale,
            mask.as_ref().map(ScaledDotProductAttentionMask::Array),
            None,
        )?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, l, -1])?;
        Ok(self.o.forward(&out)?)
    }
}

/// The boolean mask `[L, ctx + L]` over `ctx` context rows then the block:
/// context row `j` is visible to query `i` always, or when
/// `ctx + i - j < window` in a sliding layer; block key `j` always, or when
/// `j <= i` if causal.
pub(crate) fn block_mask(
    ctx: usize,
    l: usize,
    window: Option<usize>,
    causal: bool,
) -> Result<Array, DFlashError> {
    let mut visible = Vec::with_capacity(l * (ctx + l));
    for i in 0..l {
        for j in 0..ctx + l {
            visible.push(if j < ctx {
                window.is_none_or(|w| ctx + i - j < w)
            } else {
                !causal || j - ctx <= i
            });
        }
    }
    Ok(Array::from_slice(&visible, &[l as i32, (ctx + l) as i32]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(ctx: usize, l: usize, window: Option<usize>, causal: bool) -> Vec<Vec<bool>> {
        let m = block_mask(ctx, l, window, causal).expect("mask");
        let flat = m.as_slice::<bool>().to_vec();
        flat.chunks(ctx + l).map(<[bool]>::to_vec).collect()
    }

    /// Two context rows, a block of three, window 4: the third query no
    /// longer sees the first context row (4 positions back).
    #[test]
    fn the_window_hides_old_context_rows_and_the_block_is_causal() {
        let (t, f) = (true, false);
        assert_eq!(
            rows(2, 3, Some(4), true),
            vec![
                vec![t, t, t, f, f],
                vec![t, t, t, t, f],
                vec![f, t, t, t, t],
            ]
        );
        assert_eq!(rows(2, 3, Some(4), false)[0], vec![t, t, t, t, t]);
        assert_eq!(rows(0, 2, Some(4), true), vec![vec![t, f], vec![t, t]]);
    }

    /// A causal full layer sees every context row and the block up to the
    /// query.
    #[test]
    fn a_causal_full_layer_sees_all_context_and_the_block_so_far() {
        let (t, f) = (true, false);
        assert_eq!(
            rows(2, 2, None, true),
            vec![vec![t, t, t, f], vec![t, t, t, t]]
        );
        assert_eq!(rows(2, 2, None, false), vec![vec![t; 4], vec![t; 4]]);
    }
}
