//! Synthetic DSpark (`Gemma4DSparkModel`) drafters for the synthetic `llama`
//! and `gemma4-text` targets, with the real checkpoints' tensor names and
//! config keys:
//!
//! - `dspark-llama`, `dspark-gemma4`: every weight random (fixed seed, our
//!   PRNG), float32; the block transformer decides the drafts.
//! - `llama-local`, `gemma4-text-local`: the target with its attention
//!   weakened (`synth_dspark.py local-target`), so that its greedy next token
//!   equals its single-token ("bigram") prediction ~70% of the time and a
//!   drafter can follow it without training.
//! - `dspark-*-fit`: the random drafter with the Markov head fitted to the
//!   near-bigram target (`synth_dspark.py fit`: a rank-`markov_rank`
//!   factorisation of its single-token next-token logits) and a zero
//!   `lm_head`, so the drafts follow the target's own bigram preferences and
//!   acceptance means something.
//! - `dspark-*-fit-bf16`, `-q8`, `-q4`: that drafter cast to bfloat16, and
//!   quantized with `mx.quantize` (8-bit group 32, 4-bit group 64),
//!   `embed_tokens` and `markov_w1` as quantized gather tables,
//!   `confidence_head.proj` kept float and recorded as `false`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::rng::{fnv1a64, Normal, SplitMix64};
use crate::shell;
use crate::synth::{self, is_current, replace_dir, write_f32_safetensors};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 3;
const SEED: u64 = 0x6473_7061_726B_0001;
const STAMP: &str = "xtask-stamp";
const SCRIPT: &str = "xtask/python/synth_dspark.py";

// Both synthetic targets have this width and vocabulary.
const HIDDEN: usize = 64;
const VOCAB: usize = 320;

/// A drafter for one synthetic target.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    target: &'static str,
    target_layers: usize,
    taps: &'static [usize],
    /// How the near-bigram copy of the target weakens its attention:
    /// tensors whose name ends with `.0` are scaled by `.1`.
    local: (&'static str, f64),
}

/// The near-bigram llama: attention outputs times 0.01 (its greedy next token
/// is its single-token prediction ~70% of the time).
const LLAMA: Spec = Spec {
    name: "dspark-llama",
    target: "llama",
    target_layers: 2,
    taps: &[0, 1],
    local: ("self_attn.o_proj.weight", 0.01),
};
/// The gemma4-text target has 4 layers (sliding, sliding, full, sliding);
/// its attention output goes through `post_attention_layernorm`, whose scale
/// times 0.3 gives ~74% single-token agreement.
const GEMMA4: Spec = Spec {
    name: "dspark-gemma4",
    target: "gemma4-text",
    target_layers: 4,
    taps: &[1, 2],
    local: ("post_attention_layernorm.weight", 0.3),
};

// The drafter.
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const INTERMEDIATE: usize = 128;
/// Drafts per block (the anchor position proposes too).
pub const BLOCK_SIZE: usize = 4;
const MASK_TOKEN: usize = 4;
const MARKOV_RANK: usize = 64;

const WEIGHT_STD: f64 = 0.25;
const EMBED_STD: f64 = 0.5;
const NORM_STD: f64 = 0.1;
const HEAD_STD: f64 = 0.1;

/// One synthetic target and its DSpark drafters.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The synthetic target (`llama`, `gemma4-text`).
    pub target: PathBuf,
    /// Its near-bigram copy, which the fitted drafters are fitted to.
    pub local_target: PathBuf,
    /// Random weights.
    pub random: PathBuf,
    /// Markov head fitted to the near-bigram target, float32.
    pub fit: PathBuf,
    /// The fitted drafter in bfloat16 (as real DSpark checkpoints ship).
    pub fit_bf16: PathBuf,
    /// The fitted drafter, 8-bit group 32.
    pub fit_q8: PathBuf,
    /// The fitted drafter, 4-bit group 64.
    pub fit_q4: PathBuf,
}

/// The drafters on disk, per target.
#[derive(Debug, Clone)]
pub struct Drafters {
    /// For the synthetic llama target.
    pub llama: Pair,
    /// For the synthetic gemma4_text target.
    pub gemma4: Pair,
}

/// Makes sure the targets and every drafter exist and are current.
pub fn ensure(python: &Path) -> Result<Drafters> {
    let models = synth::ensure(python)?;
    Ok(Drafters {
        llama: pair(python, &models, &LLAMA)?,
        gemma4: pair(python, &models, &GEMMA4)?,
    })
}

fn pair(python: &Path, models: &[synth::Checkpoint], spec: &Spec) -> Result<Pair> {
    let target = models
        .iter()
        .find(|c| c.name == spec.target)
        .map(|c| c.dir.clone())
        .with_context(|| format!("the synthetic {} target is missing", spec.target))?;
    let base = synth::models_dir();
    let random = base.join(spec.name);
    let stamp = format!(
        "generator {GENERATOR_VERSION}\nseed {SEED:#x}\n{}\n",
        config(spec)
    );
    if !is_current(&random, &stamp) {
        eprintln!("generating synthetic DSpark drafter {}", random.display());
        replace_dir(&random, &stamp, |tmp| write_checkpoint(spec, tmp))?;
    }
    let script = shell::root().join(SCRIPT);
    let script_hash =
        fnv1a64(&std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?);
    let stamp_of = |dir: &Path| {
        std::fs::read_to_string(dir.join(STAMP))
            .with_context(|| format!("reading {}", dir.join(STAMP).display()))
    };
    let derived =
        |name: String, src: &Path, inputs: &[&Path], args: &[String]| -> Result<PathBuf> {
            let dir = base.join(name);
            let mut stamp = stamp_of(src)?;
            for input in inputs {
                stamp += &stamp_of(input)?;
            }
            stamp += &format!("derived with {args:?}\nscript fnv1a64 {script_hash:016x}\n");
            if !is_current(&dir, &stamp) {
                eprintln!("deriving {} from {}", dir.display(), src.display());
                replace_dir(&dir, &stamp, |tmp| {
                    shell::run(
                        Command::new(python)
                            .arg(&script)
                            .args(args)
                            .arg("--src")
                            .arg(src)
                            .arg("--dst")
                            .arg(tmp),
                    )
                })?;
            }
            Ok(dir)
        };
    let (suffix, scale) = spec.local;
    let local_args = [
        "local-target".to_owned(),
        "--suffix".into(),
        suffix.into(),
        "--scale".into(),
        scale.to_string(),
    ];
    let local_target = derived(format!("{}-local", spec.target), &target, &[], &local_args)?;
    let fit = derived(
        format!("{}-fit", spec.name),
        &random,
        &[&local_target],
        &[
            "fit".into(),
            "--target".into(),
            local_target.display().to_string(),
        ],
    )?;
    let fit_bf16 = derived(
        format!("{}-fit-bf16", spec.name),
        &fit,
        &[],
        &["cast".into(), "--dtype".into(), "bfloat16".into()],
    )?;
    let q = |bits: u32, group: u32| {
        vec![
            "quantize".to_owned(),
            "--bits".into(),
            bits.to_string(),
            "--group-size".into(),
            group.to_string(),
        ]
    };
    let fit_q8 = derived(format!("{}-fit-q8", spec.name), &fit, &[], &q(8, 32))?;
    let fit_q4 = derived(format!("{}-fit-q4", spec.name), &fit, &[], &q(4, 64))?;
    Ok(Pair {
        target,
        local_target,
        random,
        fit,
        fit_bf16,
        fit_q8,
        fit_q4,
    })
}

/// `config.json` as DeepSpec saves a `Gemma4DSparkModel` (a `Gemma4TextConfig`
/// plus the DSpark keys).
fn config(spec: &Spec) -> Value {
    json!({
        "architectures": ["Gemma4DSparkModel"],
        "model_type": "gemma4_text",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "global_head_dim": HEAD_DIM,
        "num_global_key_value_heads": KV_HEADS,
        "attention_k_eq_v": true,
        "attention_bias": false,
        "intermediate_size": INTERMEDIATE,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0,
        "vocab_size": VOCAB,
        "block_size": BLOCK_SIZE,
        "mask_token_id": MASK_TOKEN,
        "num_anchors": 512,
        "target_layer_ids": spec.taps,
        "num_target_layers": spec.target_layers,
        "markov_rank": MARKOV_RANK,
        "markov_head_type": "vanilla",
        "enable_confidence_head": true,
        "confidence_head_with_markov": true,
        "enable_moe_block": false,
        "hidden_size_per_layer_input": 0,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
        },
        "torch_dtype": "float32",
    })
}

#[derive(Debug, Clone, Copy)]
enum Init {
    Normal(f64),
    OnePlusNormal(f64),
}

/// Every tensor, named as DeepSpec's `Gemma4DSparkModel` state dict names it.
fn tensors(spec: &Spec) -> Vec<(String, Vec<usize>, Init)> {
    let (q_out, kv_out) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut t = vec![
        (
            "embed_tokens.weight".to_owned(),
            vec![VOCAB, HIDDEN],
            Init::Normal(EMBED_STD),
        ),
        (
            "fc.weight".to_owned(),
            vec![HIDDEN, spec.taps.len() * HIDDEN],
            Init::Normal(WEIGHT_STD),
        ),
        (
            "hidden_norm.weight".to_owned(),
            vec![HIDDEN],
            Init::OnePlusNormal(NORM_STD),
        ),
    ];
    for i in 0..LAYERS {
        let p = format!("layers.{i}");
        let mut add =
            |name: &str, shape: Vec<usize>, init| t.push((format!("{p}.{name}"), shape, init));
        add(
            "self_attn.q_proj.weight",
            vec![q_out, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.k_proj.weight",
            vec![kv_out, HIDDEN],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.o_proj.weight",
            vec![HIDDEN, q_out],
            Init::Normal(WEIGHT_STD),
        );
        add(
            "self_attn.q_norm.weight",
            vec![HEAD_DIM],
            Init::OnePlusNormal(NORM_STD),
        );
        add(
            "self_attn.k_norm.weight",
            vec![HEAD_DIM],
            Init::OnePlusNormal(NORM_STD),
        );
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(
                &format!("{norm}.weight"),
                vec![HIDDEN],
                Init::OnePlusNormal(NORM_STD),
            );
        }
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
    t.push((
        "norm.weight".to_owned(),
        vec![HIDDEN],
        Init::OnePlusNormal(NORM_STD),
    ));
    t.push((
        "lm_head.weight".to_owned(),
        vec![VOCAB, HIDDEN],
        Init::Normal(WEIGHT_STD),
    ));
    t.push((
        "markov_head.markov_w1.weight".to_owned(),
        vec![VOCAB, MARKOV_RANK],
        Init::Normal(WEIGHT_STD),
    ));
    t.push((
        "markov_head.markov_w2.weight".to_owned(),
        vec![VOCAB, MARKOV_RANK],
        Init::Normal(WEIGHT_STD),
    ));
    t.push((
        "confidence_head.proj.weight".to_owned(),
        vec![1, HIDDEN + MARKOV_RANK],
        Init::Normal(HEAD_STD),
    ));
    t.push((
        "confidence_head.proj.bias".to_owned(),
        vec![1],
        Init::Normal(HEAD_STD),
    ));
    t
}

fn values(model: &str, tensor: &str, len: usize, init: Init) -> Vec<f32> {
    let mut normal = Normal::new(SplitMix64::keyed(SEED, &format!("{model}/{tensor}")));
    let (offset, std) = match init {
        Init::Normal(std) => (0.0, std),
        Init::OnePlusNormal(std) => (1.0, std),
    };
    (0..len)
        .map(|_| (offset + std * normal.sample()) as f32)
        .collect()
}

fn write_checkpoint(spec: &Spec, dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config(spec))? + "\n",
    )?;
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = tensors(spec)
        .into_iter()
        .map(|(name, shape, init)| {
            let v = values(spec.name, &name, shape.iter().product(), init);
            (name, shape, v)
        })
        .collect();
    write_f32_safetensors(&dir.join("model.safetensors"), &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes re-derived from the config alone, as DeepSpec's modeling file
    /// builds its modules.
    #[test]
    fn tensors_match_what_the_config_implies() {
        for spec in [LLAMA, GEMMA4] {
            check_spec(&spec);
        }
    }

    fn check_spec(spec: &Spec) {
        let c = config(spec);
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
        let (h, v, r, hd) = (
            n("hidden_size"),
            n("vocab_size"),
            n("markov_rank"),
            n("global_head_dim"),
        );
        let taps = c["target_layer_ids"].as_array().expect("taps").len();
        let shapes: std::collections::HashMap<String, Vec<usize>> = tensors(spec)
            .into_iter()
            .map(|(name, s, _)| (name, s))
            .collect();
        assert_eq!(shapes["fc.weight"], vec![h, taps * h]);
        assert_eq!(shapes["markov_head.markov_w1.weight"], vec![v, r]);
        assert_eq!(shapes["markov_head.markov_w2.weight"], vec![v, r]);
        assert_eq!(shapes["confidence_head.proj.weight"], vec![1, h + r]);
        for i in 0..n("num_hidden_layers") {
            assert_eq!(
                shapes[&format!("layers.{i}.self_attn.k_proj.weight")],
                vec![n("num_global_key_value_heads") * hd, h]
            );
            assert_eq!(
                shapes[&format!("layers.{i}.self_attn.q_proj.weight")],
                vec![n("num_attention_heads") * hd, h]
            );
            assert_eq!(
                shapes[&format!("layers.{i}.mlp.down_proj.weight")],
                vec![h, n("intermediate_size")]
            );
            assert!(
                !shapes.contains_key(&format!("layers.{i}.self_attn.v_proj.weight")),
                "attention_k_eq_v: no v_proj"
            );
        }
        assert_eq!(shapes.len(), 3 + 13 * n("num_hidden_layers") + 6);
    }

    #[test]
    fn generation_is_deterministic() {
        let a = values("m", "fc.weight", 16, Init::Normal(1.0));
        assert_eq!(a, values("m", "fc.weight", 16, Init::Normal(1.0)));
        assert_ne!(a, values("m", "lm_head.weight", 16, Init::Normal(1.0)));
        assert_ne!(a, values("n", "fc.weight", 16, Init::Normal(1.0)));
    }
}
