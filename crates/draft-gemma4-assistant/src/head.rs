//! The drafter's output head: the tied embedding table, an `lm_head`, or
//! the centroid head of the small drafters (score the centroids, keep the
//! top `k`, score only their tokens as listed by `token_ordering`; every
//! other token gets -1e30). Op order as optiq 0.7.7's `_centroid_decode`.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{argpartition_axis, full};
use mlx_rs::{Array, Dtype};
use spec_models::DtypePolicy;
use spec_runtime::layers::{Embedding, Linear};
use spec_runtime::weights::WeightsView;

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
            None => {
                return Err(AssistantError::TokenOrdering {
                    vocab,
                    problem: format!("entry {i} is {id}, outside the vocabulary"),
                })
            }
            Some(true) => {
                return Err(AssistantError::TokenOrdering {
                    vocab,
                    problem: format!("token {id} is listed twice"),
                })
            }
            Some(s) => *s = true,
        }
    }
    Ok(())
}

impl Head {
    /// Loads the head the config names.
    pub fn load(vb: &WeightsView<'_>, c: &AssistantConfig) -> Result<Self, AssistantError> {
        Ok(match c.head {
            HeadKind::Tied => Head::Tied,
            HeadKind::Untied => {
                Head::Untied(Linear::load(&vb.pp("lm_head"), c.hidden, c.vocab, false)?)
            }
            HeadKind::Centroid(shape) => {
                let m = vb.pp("masked_embedding");
                let centroids = m.take_shaped("centroids.weight", &[shape.centroids, c.hidden])?;
                let centroids = if vb.policy() == DtypePolicy::Float32 {
                    centroids.as_dtype(Dtype::Float32)?
                } else {
                    centroids
                };
                let raw = m.take_shaped("token_ordering", &[c.vocab])?;
                if !matches!(
                    raw.dtype(),
                    Dtype::Int64 | Dtype::Int32 | Dtype::Uint32 | Dtype::Uint64
                ) {
                    return Err(AssistantError::TokenOrdering {
                        vocab: c.vocab,
                        problem: format!("dtype {:?} is not an integer type", raw.dtype()),
                    });
                }
                let ordering = raw.as_dtype(Dtype::Int32)?;
                check_permutation(&ordering, c.vocab)?;
                let ordering = ordering.reshape(&[shape.centroids, shape.per_centroid])?;
                centroids.eval()?;
                ordering.eval()?;
                Head::Centroid {
                    shape,
                    centroids,
                    ordering,
                    vocab: c.vocab,
                }
            }
        })
    }

    /// Bytes of the head's own tensors.
    pub fn nbytes(&self) -> usize {
        match self {
            Head::Tied => 0,
            Head::Untied(l) => l.nbytes(),
            Head::Centroid {
                centroids,
                ordering,
                ..
            } => centroids.nbytes() + ordering.nbytes(),
        }
    }

    /// Logits `[1, 1, V]` of the normed hidden `h` (`[1, 1, hidden]`).
    pub fn logits(&self, h: &Array, embed: &Embedding) -> Result<Array, AssistantError> {
        match self {
            Head::Tied => Ok(embed.as_linear(h)?),
            Head::Untied(l) => Ok(l.forward(h)?),
            Head::Centroid {
                shape,
                centroids,
                ordering,
                vocab,
            } => {
                let scores = h.matmul(centroids.t())?;
                let k = shape.top_k.min(shape.centroids);
                let top = argpartition_axis(scores.negative()?, k - 1, -1)?.index((.., .., ..k));
                let candidates = ordering.take_axis(&top, 0)?;
                let rows = embed.forward(&candidates)?;
                let dim = h.shape()[2];
                let scored = h
                    .reshape(&[1, 1, 1, 1, dim])?
                    .multiply(&rows)?
                    .sum_axis(-1, None)?;
                let n = k * shape.per_centroid;
                let scored = scored.reshape(&[1, 1, n])?;
                let ids = candidates.reshape(&[1, 1, n])?;
                let base =
                    full::<f32>(&[1, 1, *vocab], Array::from_f32(-1e30))?.as_dtype(h.dtype())?;
                Ok(base.put_along_axis(&ids, &scored.as_dtype(h.dtype())?, -1)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use spec_runtime::config::Quantization;
    use spec_runtime::weights::Weights;

    use super::*;
    use crate::config::LayerKind;

    /// Vocab 12, hidden 4, 3 centroids of 4 tokens, top 1.
    fn setup(ordering: &[i64]) -> (Weights, AssistantConfig) {
        let embed: Vec<f32> = (0..48)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let centroids: Vec<f32> = vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        let tensors = HashMap::from([
            (
                "model.embed_tokens.weight".to_owned(),
                Array::from_slice(&embed, &[12, 4]),
            ),
            (
                "masked_embedding.centroids.weight".to_owned(),
                Array::from_slice(&centroids, &[3, 4]),
            ),
            (
                "masked_embedding.token_ordering".to_owned(),
                Array::from_slice(ordering, &[12]),
            ),
        ]);
        let config = AssistantConfig {
            model_type: "gemma4_assistant".into(),
            backbone_hidden: 4,
            hidden: 4,
            intermediate: 4,
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            global_head_dim: 4,
            eps: 1e-6,
            layers: vec![LayerKind::Sliding],
            sliding_window: 4,
            vocab: 12,
            rope_theta_sliding: 1e4,
            rope_theta_full: 1e6,
            full_partial_rotary_factor: 1.0,
            head: HeadKind::Centroid(CentroidHead {
                centroids: 3,
                top_k: 1,
                per_centroid: 4,
            }),
        };
        (Weights::from_map(PathBuf::from("mem"), tensors), config)
    }

    #[test]
    fn the_centroid_head_scores_only_the_top_centroids_tokens() {
        let ordering: Vec<i64> = vec![3, 7, 11, 0, 1, 5, 9, 2, 4, 6, 8, 10];
        let (w, c) = setup(&ordering);
        let quant = Quantization::default();
        let vb = w.view(&quant, DtypePolicy::Float32);
        let embed = Embedding::load(&vb.pp("model.embed_tokens"), 12, 4).expect("embed");
        let head = Head::load(&vb, &c).expect("head");
        // h points at centroid 1: its tokens are ordering[4..8].
        let h = Array::from_slice(&[0.1f32, 2.0, -0.3, 0.5], &[1, 1, 4]);
        let logits = head.logits(&h, &embed).expect("logits");
        let dense = embed.as_linear(&h).expect("dense");
        logits.eval().expect("eval");
        dense.eval().expect("eval");
        let (l, d) = (logits.as_slice::<f32>(), dense.as_slice::<f32>());
        for tok in 0..12usize {
            if ordering[4..8].contains(&(tok as i64)) {
                assert!(
                    (l[tok] - d[tok]).abs() < 1e-6,
                    "token {tok}: {} vs {}",
                    l[tok],
                    d[tok]
                );
            } else {
                assert_eq!(l[tok], -1e30, "token {tok} outside the top centroid");
            }
        }
    }

    #[test]
    fn an_ordering_that_is_no_permutation_is_refused() {
        let quant = Quantization::default();
        let (w, c) = setup(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10]);
        let err = Head::load(&w.view(&quant, DtypePolicy::Float32), &c)
            .expect_err("duplicate")
            .to_string();
        assert!(err.contains("token 10 is listed twice"), "{err}");
        let (w, c) = setup(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12]);
        let err = Head::load(&w.view(&quant, DtypePolicy::Float32), &c)
            .expect_err("out of range")
            .to_string();
        assert!(err.contains("outside the vocabulary"), "{err}");
    }
}
