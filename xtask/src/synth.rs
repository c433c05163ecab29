//! The gates' synthetic checkpoints on disk: the float llama-family ones
//! (layouts in `spec_fixtures`, written at gate sizes), quantized copies in
//! mlx-lm's saved format, and the other families through their `synth_*`
//! modules. Each directory is stamped and regenerated only when missing or
//! when what generates it changes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use spec_fixtures::llama::{self, Llama};
pub use spec_fixtures::read_f32;
use spec_fixtures::rng::fnv1a64;

use crate::shell;

/// Bump when anything below changes what gets written: every checkpoint is
/// then regenerated on the next run.
pub(crate) const GENERATOR_VERSION: u32 = 1;

pub(crate) const SEED: u64 = spec_fixtures::GATE_SEED;

/// Written last into each checkpoint directory; its content identifies what
/// generated the directory.
pub(crate) const STAMP: &str = "xtask-stamp";

/// A synthetic checkpoint on disk.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub name: String,
    pub dir: PathBuf,
}

/// A quantized copy of one float checkpoint, made by `quantize_synth.py`.
#[derive(Debug, Clone, Copy)]
struct QuantSpec {
    name: &'static str,
    source: &'static str,
    /// mlx-lm's `quantization` block: defaults, then per-module overrides.
    block: fn() -> Value,
}

const QUANT_SPECS: &[QuantSpec] = &[
    // The drafter of `gpt-oss` in the speculative gates (close to it: its
    // drafts are mostly accepted, some rolled back past the window).
    QuantSpec {
        name: "gpt-oss-q8g32",
        source: "gpt-oss",
        block: || json!({"group_size": 32, "bits": 8, "mode": "affine"}),
    },
    QuantSpec {
        name: "llama-q4g64",
        source: "llama",
        block: || json!({"group_size": 64, "bits": 4, "mode": "affine"}),
    },
    QuantSpec {
        name: "llama-q8g32",
        source: "llama",
        block: || json!({"group_size": 32, "bits": 8, "mode": "affine"}),
    },
    QuantSpec {
        name: "llama-mixed",
        source: "llama",
        // Shaped like `mlx_lm.convert --quant-predicate mixed_*` output: the
        // defaults, then the modules that differ from them.
        block: || {
            json!({
                "group_size": 64, "bits": 4, "mode": "affine",
                "model.embed_tokens": {"group_size": 32, "bits": 6, "mode": "affine"},
                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "affine"},
                "model.layers.1.self_attn.v_proj": {"group_size": 64, "bits": 6, "mode": "affine"},
                "lm_head": {"group_size": 32, "bits": 8, "mode": "affine"},
            })
        },
    },
];

const QUANTIZE_SCRIPT: &str = "xtask/python/quantize_synth.py";

/// Directory holding every synthetic checkpoint.
pub fn models_dir() -> PathBuf {
    shell::root().join("target").join("gate-models")
}

/// Makes sure every synthetic target checkpoint exists and is current;
/// `python` (the project venv's) derives the quantized copies. Drafter
/// checkpoints that are no target (the Gemma-4 assistants) come from
/// `ensure_with_assistants`.
pub fn ensure(python: &Path) -> Result<Vec<Checkpoint>> {
    let base = models_dir();
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let mut out = Vec::new();
    for spec in llama::GATE {
        out.push(Checkpoint {
            name: spec.name.to_owned(),
            dir: ensure_llama(spec)?,
        });
    }
    for q in QUANT_SPECS {
        let source = llama::GATE
            .iter()
            .find(|s| s.name == q.source)
            .context("quantized copy of an unknown checkpoint")?;
        let (src, dir) = (base.join(source.name), base.join(q.name));
        quantized_copy(python, &src, &float_stamp(source), &dir, &(q.block)())?;
        out.push(Checkpoint {
            name: q.name.to_owned(),
            dir,
        });
    }
    out.extend(crate::synth_glm::ensure(python)?);
    out.extend(crate::synth_gemma4::ensure(&base, python)?);
    Ok(out)
}

/// One float llama-family checkpoint under `models_dir()`, written when
/// missing or stale; its directory.
pub fn ensure_llama(spec: &Llama) -> Result<PathBuf> {
    let dir = models_dir().join(spec.name);
    let stamp = float_stamp(spec);
    if !is_current(&dir, &stamp) {
        eprintln!("generating synthetic checkpoint {}", dir.display());
        replace_dir(&dir, &stamp, |tmp| Ok(spec.write(tmp)?))?;
    }
    Ok(dir)
}

/// The target checkpoints of `ensure` followed by the synthetic Gemma-4
/// assistant drafters written for them.
pub fn ensure_with_assistants(python: &Path) -> Result<Vec<Checkpoint>> {
    let mut out = ensure(python)?;
    let assistants = crate::synth_assistant::ensure(&models_dir(), &out)?;
    out.extend(assistants);
    Ok(out)
}

/// `cargo xtask synth`: makes sure every checkpoint is current, prints
/// `name directory` lines.
pub fn print_all() -> Result<()> {
    let python = crate::venv::ensure()?;
    let hybrid = crate::synth_qwen3_next::ensure(&models_dir(), &python)?;
    for c in ensure_with_assistants(&python)?.into_iter().chain(hybrid) {
        println!("{} {}", c.name, c.dir.display());
    }
    Ok(())
}

/// Makes sure `dir` holds float checkpoint `src` (stamped `src_stamp`)
/// quantized by `quantize_synth.py` with mlx-lm quantization block `block`.
pub(crate) fn quantized_copy(
    python: &Path,
    src: &Path,
    src_stamp: &str,
    dir: &Path,
    block: &Value,
) -> Result<()> {
    let script = shell::root().join(QUANTIZE_SCRIPT);
    let script_text =
        std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?;
    let stamp = format!(
        "{src_stamp}quantized with {block}\nscript fnv1a64 {:016x}\n",
        fnv1a64(&script_text)
    );
    if is_current(dir, &stamp) {
        return Ok(());
    }
    eprintln!("quantizing {} into {}", src.display(), dir.display());
    replace_dir(dir, &stamp, |tmp| {
        shell::run(
            Command::new(python)
                .arg(&script)
                .arg("--src")
                .arg(src)
                .arg("--dst")
                .arg(tmp)
                .arg("--quantization")
                .arg(block.to_string()),
        )
    })
}

fn float_stamp(spec: &Llama) -> String {
    format!(
        "generator {GENERATOR_VERSION}\nseed {SEED:#x}\n{}\n",
        spec.config()
    )
}

pub(crate) fn is_current(dir: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp)
}

/// Fills a fresh temporary directory with `fill`, stamps it and moves it into
/// place, so an interrupted run never leaves a half-written checkpoint.
pub(crate) fn replace_dir(
    dir: &Path,
    stamp: &str,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let name = dir
        .file_name()
        .context("checkpoint directory without a name")?
        .to_string_lossy();
    let tmp = dir.with_file_name(format!(".{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    fill(&tmp)?;
    std::fs::write(tmp.join(STAMP), stamp)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir)
        .with_context(|| format!("moving {} to {}", tmp.display(), dir.display()))
}

/// A checkpoint `name` in the gate models derived from `src` (and reading
/// `inputs`) by `python SCRIPT ARGS --src SRC --dst DIR`; derived again when
/// the stamp of `src` or of an input, the arguments or the script change.
pub(crate) fn derived(
    python: &Path,
    script: &str,
    name: &str,
    src: &Path,
    inputs: &[&Path],
    args: &[String],
) -> Result<PathBuf> {
    let script = shell::root().join(script);
    let script_hash =
        fnv1a64(&std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?);
    let stamp_of = |dir: &Path| {
        std::fs::read_to_string(dir.join(STAMP))
            .with_context(|| format!("reading {}", dir.join(STAMP).display()))
    };
    let dir = models_dir().join(name);
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
}
