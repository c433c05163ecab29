//! `cargo xtask bench hybrid`: a hybrid Gated DeltaNet stack sized like the
//! smallest Qwen3.5 (about 0.6 B parameters in float32: hidden 1024, 24
//! layers of which every fourth is gated attention, 16 key and 16 value
//! heads of 128 in the Gated DeltaNet layers, random weights, SmolLM2's
//! tokenizer and vocabulary so both engines read a prompt), through
//! `bench decode`: decoding ours against mlx-lm on the same files, then
//! verify windows of 1, 4, 8 and 17 rows with their rollback time and the
//! bytes each holds (a one-row window's: the recurrent states of one
//! position of one row, measured).
//!
//! Options: those of `bench decode` but `--model`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use spec_fixtures::qwen3_next::{Qwen3Next, GATE_QWEN3_5};

use crate::{real_model, shell, synth};

/// The stand-in: not Qwen3.5-0.8B's exact configuration (not published
/// here), its size class.
const SPEC: Qwen3Next = Qwen3Next {
    name: "bench-hybrid-0.6b",
    layers: 24,
    interval: 4,
    hidden: 1024,
    intermediate: 3584,
    heads: 8,
    kv_heads: 2,
    head_dim: 128,
    linear_key_heads: 16,
    linear_value_heads: 16,
    linear_key_dim: 128,
    linear_value_dim: 128,
    kernel: 4,
    vocab: 49152,
    tied: false,
    ..GATE_QWEN3_5
};

/// Bump when what gets written changes.
const GENERATOR_VERSION: u32 = 2;

/// The checkpoint directory, written on first use.
fn ensure() -> Result<PathBuf> {
    let dir = shell::root()
        .join("target")
        .join("bench-models")
        .join(SPEC.name);
    let stamp = format!(
        "bench hybrid generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
        SPEC.seed,
        SPEC.config()
    );
    if !synth::is_current(&dir, &stamp) {
        let tokenizer = real_model::ensure()?;
        eprintln!("generating {} (about 2.5 GB)", dir.display());
        synth::replace_dir(&dir, &stamp, |tmp| {
            SPEC.write(tmp)?;
            for file in ["tokenizer.json", "tokenizer_config.json"] {
                std::fs::copy(tokenizer.join(file), tmp.join(file))
                    .with_context(|| format!("copying the tokenizer's {file}"))?;
            }
            Ok(())
        })?;
    }
    Ok(dir)
}

pub fn run(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--model") {
        bail!("bench hybrid writes its own model: --model is bench decode's");
    }
    let model = ensure()?;
    let mut decode_args = vec![
        "--model".to_owned(),
        model.display().to_string(),
        "--max-tokens".to_owned(),
        "48".to_owned(),
    ];
    decode_args.extend(args.iter().cloned());
    super::decode::run(&decode_args)
}
