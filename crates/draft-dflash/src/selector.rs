//! DFlash2's candidate selector, in `model_mlx.py`'s op order.
//!
//! Per mask position the `selector_top_k` candidates are MLX's
//! `argpartition(logits, -k)`'s last `k` (in that order). Each is scored by
//! its logit plus a bilinear edge from the token chosen before it (the
//! anchor for the first): `sum(pred[prev] * proj(h) * succ[cand])` over the
//! rank, `pred` / `succ` the codebooks `[V, R]`, `proj` the
//! `hidden_projection [R, H]` of the position's final hidden state. The
//! chosen candidate is the next position's predecessor: a chain, one
//! position after another.
//!
//! Greedy requests take the argmax of the scores as the oracle does.
//! Sampled requests draw from the request's sampler over the scores spread
//! on the vocabulary (`-inf` off the candidates); that distribution is the
//! draft's `q`, so rejection sampling stays exact.

use mlx_rs::ops::indexing::{argmax_axis, put_along_axis, take_along_axis, IndexOp, NewAxis};
use mlx_rs::ops::{argpartition_axis, full};
use mlx_rs::{Array, Dtype};
use spec_core::Sampler;
use spec_runtime::layers::Linear;
use spec_runtime::weights::WeightsView;

use crate::config::DFlash2Config;
use crate::DFlashError;

/// `candidate_selector` of a `DFlash2DraftModel`.
#[derive(Debug)]
pub(crate) struct CandidateSelector {
    /// `predecessor_codebook`, `[V, R]`.
    predecessor: Array,
    /// `successor_codebook`, `[V, R]`.
    successor: Array,
    hidden_projection: Linear,
    top_k: i32,
}

/// The chain of one block: the tokens and, per position, the
/// log-probabilities over the vocabulary they were drawn from.
pub(crate) struct Chain {
    pub(crate) tokens: Array,
    pub(crate) logprobs: Vec<Array>,
}

impl CandidateSelector {
    pub(crate) fn load(
        vb: &WeightsView<'_>,
        hidden: i32,
        vocab: i32,
        c: &DFlash2Config,
    ) -> Result<Self, DFlashError> {
        let rank = c.selector_rank;
        Ok(Self {
            predecessor: vb.take_cast("predecessor_codebook", &[vocab, rank])?,
            successor: vb.take_cast("successor_codebook", &[vocab, rank])?,
            hidden_projection: Linear::load(&vb.pp("hidden_projection"), hidden, rank, false)?,
            top_k: c.selector_top_k,
        })
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.predecessor.nbytes() + self.successor.nbytes() + self.hidden_projection.nbytes()
    }

    /// The chain after `anchor` over the masks' final hidden states `h`
    /// `[1, L, H]` and their logits `[1, L, V]`.
    pub(crate) fn select(
        &self,
        h: &Array,
        logits: &Array,
        anchor: u32,
        sampler: &mut dyn Sampler,
    ) -> Result<Chain, DFlashError> {
        let vocab = logits.shape()[2];
        let k = self.top_k;
        let candidates = argpartition_axis(logits, -k, -1)?.index((.., .., (vocab - k)..));
        let unary = take_along_axis(logits, &candidates, -1)?;
        let projected = self.hidden_projection.forward(h)?;
        let greedy = sampler.is_greedy();
        let mut predecessor = Array::from_slice(&[anchor as i32], &[1]);
        let (mut path, mut logprobs) = (Vec::new(), Vec::new());
        for position in 0..h.shape()[1] {
            let row = candidates.index((.., position, ..));
            let edges = self
                .predecessor
                .take_axis(&predecessor, 0)?
                .index((.., NewAxis, ..))
                .multiply(projected.index((.., position, NewAxis, ..)))?
                .multiply(self.successor.take_axis(&row, 0)?)?
                .sum_axis(-1, false)?;
            let scores = unary.index((.., position, ..)).add(&edges)?;
            let spread = put_along_axis(
                &full::<f32>(&[1, vocab], Array::from_f32(f32::NEG_INFINITY))?
                    .as_dtype(scores.dtype())?,
                &row,
                &scores,
                -1,
            )?;
            let lp = mlx_ext::softmax::log_softmax(&spread)?;
            predecessor = if greedy {
                let selected = argmax_axis(&scores, -1, false)?;
                take_along_axis(&row, selected.index((.., NewAxis)), -1)?.index((.., 0))
            } else {
                sampler.sample(&lp)?.as_dtype(Dtype::Uint32)?
            };
            path.push(predecessor.clone());
            logprobs.push(lp);
        }
        Ok(Chain {
            tokens: mlx_rs::ops::concatenate(&path, 0)?,
            logprobs,
        })
    }
}
