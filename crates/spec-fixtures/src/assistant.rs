//! The Gemma-4 assistant drafter layout (`gemma4_assistant` with the centroid
//! head, `gemma4_unified_assistant` with the tied head): a `text_config`
//! backbone of Q-only blocks (keys and values come from the target), the
//! `pre_projection` / `post_projection` between the target's and the
//! drafter's widths, and for the centroid head `masked_embedding.centroids`
//! with an int64 `masked_embedding.token_ordering`.
//!
//! Weights are random ([`Weights::Random`]), or shaped to "echo"
//! ([`Weights::Echo`]): `pre_projection` maps the scaled target embedding of
//! the input token into the drafter's space through a random projection `P`
//! and the drafter's embedding table is `E_target P^T`, so the head favours
//! the input token; the blocks (random, behind small post-norms) perturb it.
//! Random weights would never agree with a target; echoing ones make drafts
//! accepted, partially and fully, and rejected.

use std::path::Path;

use serde_json::{json, Value};

use crate::rng::{Normal, SplitMix64};
use crate::{
    Data, Error, Init, Tensor, TensorSpec, FULL, GATE_SEED, NORM_STD, SLIDING, WEIGHT_STD,
};

/// Scale of the echoing drafter's post-attention / post-feed-forward norms:
/// how loudly the blocks perturb the echo.
const POST_NORM_STD: f64 = 0.3;
/// RMS of the echo in the drafter's residual stream (the blocks add about
/// `POST_NORM_STD` per element on top).
const ECHO_LEVEL: f64 = 3.0;

/// One Gemma-4 assistant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assistant {
    /// Name; with `seed` it keys every tensor's PRNG stream.
    pub name: &'static str,
    /// PRNG seed.
    pub seed: u64,
    /// The centroid head (`gemma4_assistant`, `use_ordered_embeddings`) or
    /// the tied one (`gemma4_unified_assistant`, carrying centroid counts
    /// all the same, as the 12B assistant does).
    pub centroid_head: bool,
    /// `backbone_hidden_size`: the target's width.
    pub backbone: usize,
    /// `vocab_size`: the target's.
    pub vocab: usize,
    /// The drafter's `hidden_size`.
    pub hidden: usize,
    /// `layer_types` of the drafter's blocks.
    pub layer_types: &'static [&'static str],
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads` (of the target caches it reads).
    pub kv_heads: usize,
    /// `head_dim` (sliding layers).
    pub head_dim: usize,
    /// `global_head_dim` (full layers).
    pub global_head_dim: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `num_centroids`.
    pub centroids: usize,
    /// `centroid_intermediate_top_k`.
    pub top_k: usize,
    /// `sliding_window` (the target's).
    pub sliding_window: usize,
    /// Writes what a Hub checkpoint carries beyond what a loader needs:
    /// `architectures`, `torch_dtype`, `max_position_embeddings`,
    /// `hidden_activation`.
    pub hub_extras: bool,
}

/// The gates' centroid-head assistant for the synthetic `gemma4-shared`
/// target (backbone 64, vocabulary 320, its sliding window).
pub const GATE_CENTROID: Assistant = Assistant {
    name: "gemma4-assistant",
    seed: GATE_SEED,
    centroid_head: true,
    backbone: 64,
    vocab: 320,
    hidden: 32,
    layer_types: &[SLIDING, SLIDING, SLIDING, FULL],
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    global_head_dim: 32,
    intermediate: 64,
    centroids: 16,
    top_k: 4,
    sliding_window: crate::gemma4::GATE_SLIDING_WINDOW,
    hub_extras: true,
};

/// The gates' tied-head assistant.
pub const GATE_TIED: Assistant = Assistant {
    name: "gemma4-assistant-tied",
    centroid_head: false,
    ..GATE_CENTROID
};

/// Every assistant of the gates.
pub const GATE: &[Assistant] = &[GATE_CENTROID, GATE_TIED];

/// Where the head tensors' values come from.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// Everything random: small embeddings (a tied head over large ones
    /// proposes the same token whatever the input), a quiet embedding half
    /// of `pre_projection` (so the chained hidden steers the drafts too),
    /// random centroids, a fixed permutation as token ordering.
    Random,
    /// Shaped to echo the input token through the target's embedding table
    /// (`[vocab, backbone]`, row-major).
    Echo {
        /// The target's `embed_tokens` values.
        target_embed: &'a [f32],
    },
}

/// `a [n, k] x b^T` for `b [m, k]`: `[n, m]`.
pub fn matmul_t(a: &[f32], b: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(a.len() / k * (b.len() / k));
    for row in a.chunks_exact(k) {
        for col in b.chunks_exact(k) {
            out.push(row.iter().zip(col).map(|(x, y)| x * y).sum());
        }
    }
    out
}

/// Rows `[left_i | right_i]` of two row-major matrices of `cols` columns.
fn concat_rows(left: &[f32], right: &[f32], cols: usize) -> Vec<f32> {
    left.chunks_exact(cols)
        .zip(right.chunks_exact(cols))
        .flat_map(|(l, r)| l.iter().chain(r).copied())
        .collect()
}

impl Assistant {
    /// A tiny assistant for tests: the gate assistant's blocks, 8 centroids
    /// (top 2), for a target of width `backbone` and vocabulary `vocab`.
    pub const fn tiny(
        centroid_head: bool,
        seed: u64,
        backbone: usize,
        vocab: usize,
        window: usize,
    ) -> Self {
        Self {
            name: "tiny-assistant",
            seed,
            centroid_head,
            backbone,
            vocab,
            centroids: 8,
            top_k: 2,
            sliding_window: window,
            hub_extras: false,
            ..GATE_CENTROID
        }
    }

    /// The `config.json`.
    pub fn config(&self) -> Value {
        let model_type = if self.centroid_head {
            "gemma4_assistant"
        } else {
            "gemma4_unified_assistant"
        };
        let mut c = json!({
            "model_type": model_type,
            "backbone_hidden_size": self.backbone,
            "use_ordered_embeddings": self.centroid_head,
            "num_centroids": self.centroids,
            "centroid_intermediate_top_k": self.top_k,
            "tie_word_embeddings": true,
            "text_config": {
                "model_type": "gemma4_text",
                "hidden_size": self.hidden,
                "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layer_types.len(),
                "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads,
                "head_dim": self.head_dim,
                "global_head_dim": self.global_head_dim,
                "rms_norm_eps": 1e-6,
                "layer_types": self.layer_types,
                "sliding_window": self.sliding_window,
                "vocab_size": self.vocab,
                "rope_parameters": {
                    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
                    "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
                },
            },
        });
        if self.hub_extras {
            c["architectures"] = json!(["Gemma4AssistantForCausalLM"]);
            c["torch_dtype"] = json!("float32");
            c["text_config"]["max_position_embeddings"] = json!(512);
            c["text_config"]["hidden_activation"] = json!("gelu_pytorch_tanh");
        }
        c
    }

    /// The random tensors besides the head ones (embedding table,
    /// `pre_projection`, centroids and ordering); `post_norm` initialises
    /// the post-attention and post-feed-forward norms.
    pub fn block_tensors(&self, post_norm: Init) -> Vec<TensorSpec> {
        let (w, norm) = (Init::Normal(WEIGHT_STD), Init::OnePlusNormal(NORM_STD));
        let (h, inter) = (self.hidden, self.intermediate);
        let mut t = vec![
            TensorSpec::new("post_projection.weight", vec![self.backbone, h], w),
            TensorSpec::new("model.norm.weight", vec![h], norm),
        ];
        for (i, kind) in self.layer_types.iter().enumerate() {
            let hd = if *kind == FULL {
                self.global_head_dim
            } else {
                self.head_dim
            };
            let l = format!("model.layers.{i}");
            let mut add = |name: &str, shape: Vec<usize>, init| {
                t.push(TensorSpec::new(format!("{l}.{name}"), shape, init))
            };
            add("input_layernorm.weight", vec![h], norm);
            add("pre_feedforward_layernorm.weight", vec![h], norm);
            add("post_attention_layernorm.weight", vec![h], post_norm);
            add("post_feedforward_layernorm.weight", vec![h], post_norm);
            add("self_attn.q_proj.weight", vec![self.heads * hd, h], w);
            add("self_attn.q_norm.weight", vec![hd], norm);
            add("self_attn.o_proj.weight", vec![h, self.heads * hd], w);
            add("mlp.gate_proj.weight", vec![inter, h], w);
            add("mlp.up_proj.weight", vec![inter, h], w);
            add("mlp.down_proj.weight", vec![h, inter], w);
            add("layer_scalar", vec![1], norm);
        }
        t
    }

    /// Every tensor with its values.
    pub fn tensors(&self, weights: Weights<'_>) -> Result<Vec<Tensor>, Error> {
        let (h, backbone, vocab) = (self.hidden, self.backbone, self.vocab);
        let draw = |name: &str, len: usize, init: Init| {
            crate::values(self.seed, self.name, name, len, init)
        };
        let (embed, pre, post_norm) = match weights {
            Weights::Random => {
                let embedding_half =
                    draw("pre_projection.embedding", h * backbone, Init::Normal(0.02));
                let hidden_half = draw("pre_projection.hidden", h * backbone, Init::Normal(0.5));
                (
                    draw("model.embed_tokens.weight", vocab * h, Init::Normal(0.05)),
                    concat_rows(&embedding_half, &hidden_half, backbone),
                    Init::OnePlusNormal(NORM_STD),
                )
            }
            Weights::Echo { target_embed } => {
                if target_embed.len() != vocab * backbone {
                    return Err(Error::Tensor {
                        name: "target embed_tokens".into(),
                        message: format!(
                            "{} values, expected [{vocab}, {backbone}]",
                            target_embed.len()
                        ),
                    });
                }
                // The echo projection P [hidden, backbone] with unit-variance
                // outputs.
                let mut normal =
                    Normal::new(SplitMix64::keyed(self.seed, &format!("{}/echo", self.name)));
                let p: Vec<f32> = (0..h * backbone)
                    .map(|_| (normal.sample() / (backbone as f64).sqrt()) as f32)
                    .collect();
                // [gain * P | small noise], the gain bringing the scaled target
                // embedding (RMS `rms * sqrt(backbone)`) to ECHO_LEVEL.
                let hidden_half = draw("pre_projection.hidden", h * backbone, Init::Normal(0.02));
                let rms = (target_embed
                    .iter()
                    .map(|x| f64::from(*x).powi(2))
                    .sum::<f64>()
                    / target_embed.len().max(1) as f64)
                    .sqrt()
                    .max(1e-6);
                let gain = (ECHO_LEVEL / (rms * (backbone as f64).sqrt())) as f32;
                let scaled: Vec<f32> = p.iter().map(|x| x * gain).collect();
                (
                    matmul_t(target_embed, &p, backbone),
                    concat_rows(&scaled, &hidden_half, backbone),
                    Init::Normal(POST_NORM_STD),
                )
            }
        };
        let mut t = vec![Tensor::f32(
            "pre_projection.weight",
            vec![h, 2 * backbone],
            pre,
        )];
        t.extend(
            self.block_tensors(post_norm)
                .iter()
                .map(|s| s.draw(self.seed, self.name)),
        );
        if self.centroid_head {
            let (centroids, ordering) = match weights {
                Weights::Random => {
                    // A permutation of the vocabulary: 7 is coprime with the
                    // test vocabularies.
                    let ordering = (0..vocab).map(|i| (7 * i + 3) % vocab).collect();
                    let centroids = draw(
                        "masked_embedding.centroids.weight",
                        self.centroids * h,
                        Init::Normal(0.5),
                    );
                    (centroids, ordering)
                }
                Weights::Echo { .. } => {
                    // Centroids: the mean drafter embedding of their tokens, so
                    // the top centroids hold the tokens the tied head favours.
                    let ordering = self.permutation(&format!("{}/token_ordering", self.name));
                    let per = vocab / self.centroids;
                    let mut centroids = vec![0f32; self.centroids * h];
                    for (c, members) in ordering.chunks_exact(per).enumerate() {
                        for &tok in members {
                            for d in 0..h {
                                centroids[c * h + d] += embed[tok * h + d] / per as f32;
                            }
                        }
                    }
                    (centroids, ordering)
                }
            };
            t.push(Tensor::f32(
                "masked_embedding.centroids.weight",
                vec![self.centroids, h],
                centroids,
            ));
            t.push(Tensor {
                name: "masked_embedding.token_ordering".into(),
                shape: vec![vocab],
                data: Data::I64(ordering.iter().map(|&i| i as i64).collect()),
            });
        }
        t.insert(
            0,
            Tensor::f32("model.embed_tokens.weight", vec![vocab, h], embed),
        );
        Ok(t)
    }

    /// A permutation of the vocabulary from the seeded generator
    /// (Fisher-Yates).
    fn permutation(&self, label: &str) -> Vec<usize> {
        let mut rng = SplitMix64::keyed(self.seed, label);
        let mut p: Vec<usize> = (0..self.vocab).collect();
        for i in (1..self.vocab).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            p.swap(i, j);
        }
        p
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (which must
    /// exist).
    pub fn write(&self, dir: &Path, weights: Weights<'_>) -> Result<(), Error> {
        crate::write_config(dir, &self.config())?;
        crate::write_tensors(&dir.join("model.safetensors"), &self.tensors(weights)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats<'a>(t: &'a [Tensor], name: &str) -> &'a [f32] {
        match t.iter().find(|t| t.name == name).map(|t| &t.data) {
            Some(Data::F32(v)) => v,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn variants_carry_their_heads_and_real_names() {
        let embed = vec![0.1f32; 320 * 64];
        for weights in [
            Weights::Random,
            Weights::Echo {
                target_embed: &embed,
            },
        ] {
            let centroid = GATE_CENTROID.tensors(weights).expect("tensors");
            let names: Vec<&str> = centroid.iter().map(|t| t.name.as_str()).collect();
            assert!(
                names.contains(&"masked_embedding.centroids.weight")
                    && names.contains(&"model.layers.3.layer_scalar"),
                "{names:?}"
            );
            assert!(
                !names
                    .iter()
                    .any(|n| n.contains("k_proj") || n.contains("v_proj")),
                "Q-only: {names:?}"
            );
            let ordering = centroid
                .iter()
                .find_map(|t| match &t.data {
                    Data::I64(o) => Some(o.clone()),
                    Data::F32(_) | Data::Bool(_) => None,
                })
                .expect("centroid variant has an ordering");
            let mut o = ordering;
            o.sort_unstable();
            assert_eq!(o, (0..320).collect::<Vec<i64>>());
            let tied = GATE_TIED.tensors(weights).expect("tensors");
            assert!(!tied.iter().any(|t| t.name.starts_with("masked_embedding")));
        }
        assert_eq!(GATE_TIED.config()["use_ordered_embeddings"], false);
    }

    #[test]
    fn the_echo_head_favours_the_input_token() {
        // With the target's table the drafter's own embedding of a token
        // scores that token highest for most tokens.
        let (vocab, h) = (GATE_TIED.vocab, GATE_TIED.hidden);
        let mut n = Normal::new(SplitMix64::keyed(1, "t"));
        let embed: Vec<f32> = (0..vocab * GATE_TIED.backbone)
            .map(|_| n.sample() as f32)
            .collect();
        let t = GATE_TIED
            .tensors(Weights::Echo {
                target_embed: &embed,
            })
            .expect("tensors");
        let table = floats(&t, "model.embed_tokens.weight");
        let hits = (0..vocab)
            .filter(|&tok| {
                let row = &table[tok * h..(tok + 1) * h];
                let scores = matmul_t(row, table, h);
                scores
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(i, _)| i)
                    == Some(tok)
            })
            .count();
        assert!(hits > vocab * 9 / 10, "{hits} of {vocab}");
    }

    #[test]
    fn echo_needs_a_table_of_the_target_shape() {
        let err = GATE_TIED
            .tensors(Weights::Echo {
                target_embed: &[0.0; 3],
            })
            .expect_err("wrong shape");
        assert!(err.to_string().contains("[320, 64]"), "{err}");
    }
}
