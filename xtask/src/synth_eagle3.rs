//! The synthetic EAGLE-3 checkpoints of gate `eagle3` and of the
//! `lossless` / `batch` case that runs the `eagle3` provider: the
//! four-layer llama target and two heads drawn for it
//! (`spec_fixtures::eagle3`), under `target/gate-models`, rewritten when
//! stale.

use std::path::{Path, PathBuf};

use anyhow::Result;
use spec_fixtures::eagle3::{Eagle3Head, GATE, TARGET};

use crate::synth;

/// Bump when the checkpoints below change.
const GENERATOR_VERSION: u32 = 2;

/// The heads, by directory name: plain, and with `fc_norm` and an
/// embedding of its own.
pub const HEADS: &[(&str, Eagle3Head)] = &[
    ("eagle3-head", GATE),
    (
        "eagle3-head-fc-norm",
        Eagle3Head {
            name: "eagle3-fc-norm",
            fc_norm: true,
            embedding: true,
            ..GATE
        },
    ),
];

/// The target's directory and each head's `(name, directory)`.
pub fn ensure() -> Result<(PathBuf, Vec<(String, PathBuf)>)> {
    let base = synth::models_dir();
    let write = |name: &str, stamp: String, f: &dyn Fn(&Path) -> Result<()>| -> Result<PathBuf> {
        let dir = base.join(name);
        if !synth::is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            synth::replace_dir(&dir, &stamp, |tmp| f(tmp))?;
        }
        Ok(dir)
    };
    let target = write(
        TARGET.name,
        format!(
            "eagle3 generator {GENERATOR_VERSION}\n{}\n",
            TARGET.config()
        ),
        &|dir| Ok(TARGET.write(dir)?),
    )?;
    let heads = HEADS
        .iter()
        .map(|(name, head)| {
            let stamp = format!(
                "eagle3 generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
                head.seed,
                head.config()
            );
            Ok((
                (*name).to_owned(),
                write(name, stamp, &|dir| Ok(head.write(dir)?))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((target, heads))
}
