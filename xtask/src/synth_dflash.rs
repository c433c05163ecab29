//! Synthetic DFlash drafters (`spec_fixtures::dflash`) under
//! `target/gate-models`, written when missing or stale, for the benches and
//! gates that run one beside a synthetic target.

use std::path::PathBuf;

use anyhow::Result;
use spec_fixtures::dflash::Dflash;

use crate::synth;

/// Bump when what a drafter's directory holds changes beyond its config.
const GENERATOR_VERSION: u32 = 1;

/// `drafter`'s directory, written when missing or stale.
pub fn ensure(drafter: &Dflash) -> Result<PathBuf> {
    let dir = synth::models_dir().join(drafter.name);
    let stamp = format!(
        "generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
        drafter.seed,
        drafter.config()
    );
    if !synth::is_current(&dir, &stamp) {
        eprintln!("generating synthetic DFlash drafter {}", dir.display());
        synth::replace_dir(&dir, &stamp, |tmp| Ok(drafter.write(tmp)?))?;
    }
    Ok(dir)
}
