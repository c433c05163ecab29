//! Small synthetic Gemma-4 assistant checkpoints for the synthetic
//! `gemma4-shared` target (backbone 64, vocabulary 320, its head widths and
//! sliding window), with the real config schema and tensor names:
//!
//! - `gemma4-assistant`: `gemma4_assistant` with the centroid head
//!   (`masked_embedding.centroids.weight`, an int64
//!   `masked_embedding.token_ordering`);
//! - `gemma4-assistant-tied`: `gemma4_unified_assistant` with the tied head
//!   (carrying centroid counts but `use_ordered_embeddings: false`, as the
//!   12B assistant does).
//!
//! Random weights would never agree with the target, so the weights are
//! shaped to "echo": `pre_projection` maps the scaled target embedding of
//! the input token into the drafter's space through a random projection `P`
//! and the drafter's embedding table is `E_target P^T`, so the head favours
//! the input token; the blocks (random, behind small post-norms) perturb
//! it. The synthetic target repeats tokens often enough that drafts are
//! accepted, partially and fully, and rejected.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::rng::{Normal, SplitMix64};
use crate::synth::{self, Checkpoint, Init};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 2;

/// The target the assistants are shaped for, and its embedding tensor.
pub const TARGET: &str = "gemma4-shared";
const TARGET_EMBED: &str = "model.language_model.embed_tokens.weight";

const BACKBONE: usize = 64;
const HIDDEN: usize = 32;
const LAYERS: [&str; 4] = [
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
];
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const GLOBAL_HEAD_DIM: usize = 32;
const INTERMEDIATE: usize = 64;
const VOCAB: usize = 320;
const CENTROIDS: usize = 16;
const TOP_K: usize = 4;

const WEIGHT_STD: f64 = 0.25;
const NORM_STD: f64 = 0.1;
/// Scale of the post-attention / post-feed-forward norms: how loudly the
/// blocks perturb the echo.
const POST_NORM_STD: f64 = 0.3;
/// RMS of the echo in the drafter's residual stream (the blocks add about
/// `POST_NORM_STD` per element on top).
const ECHO_LEVEL: f64 = 3.0;

#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    model_type: &'static str,
    centroid_head: bool,
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "gemma4-assistant",
        model_type: "gemma4_assistant",
        centroid_head: true,
    },
    Variant {
        name: "gemma4-assistant-tied",
        model_type: "gemma4_unified_assistant",
        centroid_head: false,
    },
];

/// Makes sure every assistant checkpoint under `base` is current; `targets`
/// must hold [`TARGET`] (their weights derive from its embedding table).
pub fn ensure(base: &Path, targets: &[Checkpoint]) -> Result<Vec<Checkpoint>> {
    let target = targets
        .iter()
        .find(|c| c.name == TARGET)
        .with_context(|| format!("the assistants need the synthetic {TARGET} target"))?;
    let target_stamp = std::fs::read_to_string(target.dir.join(synth::STAMP))
        .with_context(|| format!("{} has no stamp", target.dir.display()))?;
    let mut out = Vec::new();
    for v in VARIANTS {
        let dir = base.join(v.name);
        let stamp = format!(
            "assistant generator {GENERATOR_VERSION}\nseed {:#x}\n{}\ntarget:\n{target_stamp}",
            synth::SEED,
            config(v)
        );
        if !synth::is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            synth::replace_dir(&dir, &stamp, |tmp| write(v, &target.dir, tmp))?;
        }
        out.push(Checkpoint {
            name: v.name.to_owned(),
            dir,
        });
    }
    Ok(out)
}

fn config(v: &Variant) -> Value {
    json!({
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": v.model_type,
        "backbone_hidden_size": BACKBONE,
        "use_ordered_embeddings": v.centroid_head,
        "num_centroids": CENTROIDS,
        "centroid_intermediate_top_k": TOP_K,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS.len(),
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "global_head_dim": GLOBAL_HEAD_DIM,
            "rms_norm_eps": 1e-6,
            "layer_types": LAYERS,
            "sliding_window": crate::synth_gemma4::SLIDING_WINDOW,
            "max_position_embeddings": 512,
            "vocab_size": VOCAB,
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
            },
        },
    })
}

/// A float tensor: name, shape, values.
type Tensor = (String, Vec<usize>, Vec<f32>);

fn random(v: &Variant, name: &str, shape: Vec<usize>, init: Init) -> Tensor {
    let values = synth::values(v.name, name, shape.iter().product(), init);
    (name.to_owned(), shape, values)
}

/// `a [n, k] x b^T` for `b [m, k]`: `[n, m]`.
fn matmul_t(a: &[f32], b: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(a.len() / k * (b.len() / k));
    for row in a.chunks_exact(k) {
        for col in b.chunks_exact(k) {
            out.push(row.iter().zip(col).map(|(x, y)| x * y).sum());
        }
    }
    out
}

/// A permutation of `0..n` from the seeded generator (Fisher-Yates).
fn permutation(label: &str, n: usize) -> Vec<usize> {
    let mut rng = SplitMix64::keyed(synth::SEED, label);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

fn tensors(v: &Variant, target_embed: &[f32]) -> (Vec<Tensor>, Option<Vec<i64>>) {
    // The echo projection P [HIDDEN, BACKBONE] with unit-variance outputs.
    let mut normal = Normal::new(SplitMix64::keyed(synth::SEED, &format!("{}/echo", v.name)));
    let p: Vec<f32> = (0..HIDDEN * BACKBONE)
        .map(|_| (normal.sample() / (BACKBONE as f64).sqrt()) as f32)
        .collect();
    // pre_projection [HIDDEN, 2 * BACKBONE]: [gain * P | small noise], the
    // gain bringing the scaled target embedding (RMS `rms * sqrt(backbone)`)
    // to ECHO_LEVEL.
    let hidden_half = synth::values(
        v.name,
        "pre_projection.hidden",
        HIDDEN * BACKBONE,
        Init::Normal(0.02),
    );
    let rms = (target_embed
        .iter()
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        / target_embed.len().max(1) as f64)
        .sqrt()
        .max(1e-6);
    let gain = (ECHO_LEVEL / (rms * (BACKBONE as f64).sqrt())) as f32;
    let mut pre = Vec::with_capacity(HIDDEN * 2 * BACKBONE);
    for r in 0..HIDDEN {
        pre.extend(p[r * BACKBONE..(r + 1) * BACKBONE].iter().map(|x| x * gain));
        pre.extend_from_slice(&hidden_half[r * BACKBONE..(r + 1) * BACKBONE]);
    }
    // The drafter's embedding table E_target P^T [VOCAB, HIDDEN].
    let embed = matmul_t(target_embed, &p, BACKBONE);
    let mut t: Vec<Tensor> = vec![
        (
            "model.embed_tokens.weight".to_owned(),
            vec![VOCAB, HIDDEN],
            embed.clone(),
        ),
        (
            "pre_projection.weight".to_owned(),
            vec![HIDDEN, 2 * BACKBONE],
            pre,
        ),
        random(
            v,
            "post_projection.weight",
            vec![BACKBONE, HIDDEN],
            Init::Normal(WEIGHT_STD),
        ),
        random(
            v,
            "model.norm.weight",
            vec![HIDDEN],
            Init::OnePlusNormal(NORM_STD),
        ),
    ];
    for (i, kind) in LAYERS.iter().enumerate() {
        let hd = if *kind == "full_attention" {
            GLOBAL_HEAD_DIM
        } else {
            HEAD_DIM
        };
        let l = format!("model.layers.{i}");
        let mut add = |name: &str, shape: Vec<usize>, init| {
            t.push(random(v, &format!("{l}.{name}"), shape, init))
        };
        add(
            "input_layernorm.weight",
            vec![HIDDEN],
            Init::OnePlusNormal(NORM_STD),
        );
        add(
            "pre_feedforward_layernorm.weight",
            vec![HIDDEN],
            Init::OnePlusNormal(NORM_STD),
        );
        add(
            "post_attention_layernorm.weight",
            vec![HIDDEN],
            Init::Normal(POST_NORM_STD),
        );
        add(
            "post_feedforward_layernorm.weight",
            vec![HIDDEN],
            Init::Normal(POST_NORM_STD),
        );
        add(
            "self_attn.q_proj.weight",
            vec![HEADS * hd, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.q_norm.weight",
            vec![hd],
            Init::OnePlusNormal(NORM_STD),
        );
        add(
            "self_attn.o_proj.weight",
            vec![HIDDEN, HEADS * hd],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.gate_proj.weight",
            vec![INTERMEDIATE, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.up_proj.weight",
            vec![INTERMEDIATE, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "mlp.down_proj.weight",
            vec![HIDDEN, INTERMEDIATE],
            Init::Normal(WEIGHT_STD),
        );
        add("layer_scalar", vec![1], Init::OnePlusNormal(NORM_STD));
    }
    if !v.centroid_head {
        return (t, None);
    }
    // Centroids: the mean drafter embedding of their tokens, so the top
    // centroids hold the tokens the tied head would favour.
    let ordering = permutation(&format!("{}/token_ordering", v.name), VOCAB);
    let per = VOCAB / CENTROIDS;
    let mut centroids = vec![0f32; CENTROIDS * HIDDEN];
    for (c, members) in ordering.chunks_exact(per).enumerate() {
        for &tok in members {
            for d in 0..HIDDEN {
                centroids[c * HIDDEN + d] += embed[tok * HIDDEN + d] / per as f32;
            }
        }
    }
    t.push((
        "masked_embedding.centroids.weight".to_owned(),
        vec![CENTROIDS, HIDDEN],
        centroids,
    ));
    (t, Some(ordering.iter().map(|&i| i as i64).collect()))
}

fn write(v: &Variant, target_dir: &Path, dir: &Path) -> Result<()> {
    let bytes = std::fs::read(target_dir.join("model.safetensors"))
        .with_context(|| format!("reading {}", target_dir.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("parsing {}", target_dir.display()))?;
    let (shape, target_embed) = synth::read_f32(&st, TARGET_EMBED)?;
    anyhow::ensure!(
        shape == [VOCAB, BACKBONE],
        "{TARGET_EMBED} of {} is {shape:?}, expected [{VOCAB}, {BACKBONE}]",
        target_dir.display()
    );
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config(v))? + "\n",
    )?;
    let (floats, ordering) = tensors(v, &target_embed);
    let mut data: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = floats
        .into_iter()
        .map(|(n, s, x)| {
            (
                n,
                safetensors::Dtype::F32,
                s,
                x.iter().flat_map(|f| f.to_le_bytes()).collect(),
            )
        })
        .collect();
    if let Some(o) = ordering {
        data.push((
            "masked_embedding.token_ordering".to_owned(),
            safetensors::Dtype::I64,
            vec![VOCAB],
            o.iter().flat_map(|i| i.to_le_bytes()).collect(),
        ));
    }
    let mut views = Vec::with_capacity(data.len());
    for (name, dtype, shape, b) in &data {
        views.push((
            name.as_str(),
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), b)
                .with_context(|| format!("tensor {name}"))?,
        ));
    }
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, Some(metadata), &path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_carry_their_heads_and_real_names() {
        let embed = vec![0.1f32; VOCAB * BACKBONE];
        let (centroid, ordering) = tensors(&VARIANTS[0], &embed);
        let names: Vec<&str> = centroid.iter().map(|(n, _, _)| n.as_str()).collect();
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
        let mut o = ordering.expect("centroid variant has an ordering");
        o.sort_unstable();
        assert_eq!(o, (0..VOCAB as i64).collect::<Vec<_>>());
        let (tied, none) = tensors(&VARIANTS[1], &embed);
        assert!(
            none.is_none()
                && !tied
                    .iter()
                    .any(|(n, _, _)| n.starts_with("masked_embedding"))
        );
        assert_eq!(config(&VARIANTS[1])["use_ordered_embeddings"], false);
    }

    #[test]
    fn the_echo_head_favours_the_input_token() {
        // With the target's table the drafter's own embedding of a token
        // scores that token highest for most tokens.
        let mut n = Normal::new(SplitMix64::keyed(1, "t"));
        let embed: Vec<f32> = (0..VOCAB * BACKBONE).map(|_| n.sample() as f32).collect();
        let (t, _) = tensors(&VARIANTS[1], &embed);
        let table = &t[0].2;
        let hits = (0..VOCAB)
            .filter(|&tok| {
                let row = &table[tok * HIDDEN..(tok + 1) * HIDDEN];
                let scores = matmul_t(row, table, HIDDEN);
                scores
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(i, _)| i)
                    == Some(tok)
            })
            .count();
        assert!(hits > VOCAB * 9 / 10, "{hits} of {VOCAB}");
    }
}
