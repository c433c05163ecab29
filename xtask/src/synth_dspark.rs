//! The gates' synthetic DSpark (`Gemma4DSparkModel`) drafters on disk for the
//! synthetic `llama` and `gemma4-text` targets (layout in
//! `spec_fixtures::dspark`), and what derives from them:
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

use anyhow::{Context, Result};
use spec_fixtures::dspark::{self, Dspark};

use crate::synth::{self, is_current, replace_dir};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 3;
const SCRIPT: &str = "xtask/python/synth_dspark.py";

/// A drafter for one synthetic target.
#[derive(Debug, Clone, Copy)]
struct Spec {
    /// The drafter's layout (name, taps, target layer count).
    drafter: Dspark,
    target: &'static str,
    /// How the near-bigram copy of the target weakens its attention:
    /// tensors whose name ends with `.0` are scaled by `.1`.
    local: (&'static str, f64),
}

/// The near-bigram llama: attention outputs times 0.01 (its greedy next token
/// is its single-token prediction ~70% of the time).
const LLAMA: Spec = Spec {
    drafter: dspark::GATE_LLAMA,
    target: "llama",
    local: ("self_attn.o_proj.weight", 0.01),
};
/// The gemma4-text target has 4 layers (sliding, sliding, full, sliding);
/// its attention output goes through `post_attention_layernorm`, whose scale
/// times 0.3 gives ~74% single-token agreement.
const GEMMA4: Spec = Spec {
    drafter: dspark::GATE_GEMMA4,
    target: "gemma4-text",
    local: ("post_attention_layernorm.weight", 0.3),
};

/// Drafts per block (the anchor position proposes too).
pub const BLOCK_SIZE: usize = dspark::GATE_LLAMA.block_size;

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
    let drafter = spec.drafter;
    let random = base.join(drafter.name);
    let stamp = format!(
        "generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
        drafter.seed,
        drafter.config()
    );
    if !is_current(&random, &stamp) {
        eprintln!("generating synthetic DSpark drafter {}", random.display());
        replace_dir(&random, &stamp, |tmp| Ok(drafter.write(tmp)?))?;
    }
    let derived = |name: String, src: &Path, inputs: &[&Path], args: &[String]| {
        synth::derived(python, SCRIPT, &name, src, inputs, args)
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
        format!("{}-fit", drafter.name),
        &random,
        &[&local_target],
        &[
            "fit".into(),
            "--target".into(),
            local_target.display().to_string(),
        ],
    )?;
    let fit_bf16 = derived(
        format!("{}-fit-bf16", drafter.name),
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
    let fit_q8 = derived(format!("{}-fit-q8", drafter.name), &fit, &[], &q(8, 32))?;
    let fit_q4 = derived(format!("{}-fit-q4", drafter.name), &fit, &[], &q(4, 64))?;
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
