//! The drafter's output head: the tied embedding table, an `lm_head`, or
//! the centroid head of the small drafters (score the centroids, keep the
//! top `k`, score only their tokens as listed by `token_ordering`; every
//! other token gets -1e30). Op order as optiq 0.7.7's `_centroid_decode`.

use mlx_rs::ops::{argpartition_axis, full};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_models::config::Quantization;
use spec_models::layers::{Embedding, Linear};
use spec_models::weights::Weights;
use spec_models::DtypePolicy;

use crate::config::{AssistantConfig, CentroidHead, HeadKind};
use crate::AssistantError;

/// The head of a loaded drafter.
#[derive(Debug)]
pub enum Head {
    /// `h E^T` with the drafter's embedding table.
    Tied,
    /// `lm_head(h)`.
    Untied(Linear),
    /// The centroid head.
    Centroid {
        /// Its shape.
        shape: CentroidHead,
        /// `masked_embedding.centroids.weight`, `[C, hidden]`.
        centroids: Array,
        /// `masked_embedding.token_ordering` as `[C, V / C]` int32.
        ordering: Array,
        /// Vocabulary size.
        vocab: i32,
    },
}

/// Checks that `ordering` lists each of `vocab` ids exactly once.
fn check_permutation(ordering: &Array, vocab: i32) -> Result<(), AssistantError> {
    ordering.eval()?;
    let ids = ordering.as_slice::<i32>();
    let mut seen = vec![false; vocab as usize];
    for (i, &id) in ids.iter().enumerate() {
        let slot = usize::try_from(id).ok().and_then(|s| seen.get_mut(s));
        match slot {
            None => return Err(AssistantError::TokenOrdering { vocab, problem: format!("entry {i} is {id}, outside the vocabulary") }),
            Some(true) => return Err(AssistantError::TokenOrdering { vocab, problem: format!("token {id} is listed twice") }),
            Some(s) => *s = true,
        }
    }
    Ok(())
}

impl Head {
    /// Loads the head the config names.
    pub fn load(w: &mut Weights, c: &AssistantConfig, quant: &Quantization, policy: DtypePolicy) -> Result<Self, AssistantError> {
        Ok(match c.head {
            HeadKind::Tied => Head::Tied,
            HeadKind::Untied => Head::Untied(Linear::load(w, "lm_head", c.hidden, c.vocab, false, quant, policy)?),
            HeadKind::Centroid(shape) => {
                let centroids = w.take_shaped("masked_embedding.centroids.weight", &[shape.centroids, c.hidden])?;
                let centroids = if policy == DtypePolicy::Float32 { centroids.as_dtype(Dtype::Float32)? } else { centroids };
                let raw = w.take_shaped("masked_embedding.token_ordering", &[c.vocab])?;
                if !matches!(raw.dtype(), Dtype::Int64 | Dtype::Int32 | Dtype::Uint32 | Dtype::Uint64) {
                    return Err(AssistantError::TokenOrdering { vocab: c.vocab, problem: format!("dtype {:?} is not an integer type", raw.dtype()) });
                }
                let ordering = raw.as_dtype(Dtype::Int32)?;
                check_permutation(&ordering, c.vocab)?;
                let ordering = ordering.reshape(&[shape.centroids, shape.per_centroid])?;
                centroids.eval()?;
                ordering.eval()?;
                Head::Centroid { shape, centroids, ordering, vocab: c.vocab }
            }
        })
    }

    /// Bytes of the head's own tensors.
    pub fn nbytes(&self) -> usize {
        match self {
            Head::Tied => 0,
            Head::Untied(l) => l.nbytes(),
            Head::Centroid { centroids, ordering, .. } => centroids.nbytes() + ordering.nbytes(),
        }
    }

    /// Logits `[1, 1, V]` of the normed hidden `h` (`[1, 1, hidden]`).
    pub fn logits(&self, h: &Array, embed: &Embedding) -> Result<Array, AssistantError> {
        match self {
            Head::Tied => Ok(embed.as_linear(h)?),
            Head::Untied(l) => Ok(l.forward(h)?),
            Head::Centroid { shape, centroids, ordering, vocab } => {
                let scores = h.matmul(centroids.t())?;
                let k = shape.top_k.min(shape.centroids);
                let top = argpartition_axis(scores.negative()?, k - 1, -1)?.index((.., .., ..k));
                let candidates = ordering.take_axis(&top, 0)?;
                let rows = embed.forward(&candidates)?;
                let dim = h.shape()[2];
                let scored = h.reshape(&[1, 1, 1, 1, dim])?.multiply(&rows)?.sum_axis(-1, None)?;
                let n = k * shape.per_centroid;
                let scored = scored.reshape(&[1, 1, n])?;
                let ids = candidates.reshape(&[1, 1, n])?;
                let base = full::<f32>(&[1, 1, *vocab], Array::from_f32(-1e30))?.as_dtype(h.dtype())?;
                Ok(base.put_along_axis(&ids, &scored.as_dtype(h.dtype())?, -1)?)
            }
        }
    }
}
