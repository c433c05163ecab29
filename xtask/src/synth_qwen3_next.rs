//! The parity gate's synthetic hybrid checkpoint (`qwen3-next`: Gated
//! DeltaNet and gated attention layers, dense MLPs, float32, fixed seed,
//! layout in `spec_fixtures::qwen3_next`). Only the parity gate runs it:
//! speculative rounds over recurrent layers are refused until their state
//! can roll back, so the speculative gates leave it out.

use std::path::Path;

use anyhow::Result;
use spec_fixtures::qwen3_next;

use crate::synth::{self, Checkpoint};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 1;

/// Makes sure the synthetic `qwen3_next` checkpoint under `base` is current.
pub fn ensure(base: &Path) -> Result<Vec<Checkpoint>> {
    let v = qwen3_next::GATE;
    let dir = base.join(v.name);
    let stamp = format!(
        "qwen3_next generator {GENERATOR_VERSION}\nseed {:#x}\n{}\n",
        v.seed,
        v.config()
    );
    if !synth::is_current(&dir, &stamp) {
        eprintln!("generating synthetic checkpoint {}", dir.display());
        synth::replace_dir(&dir, &stamp, |tmp| Ok(v.write(tmp)?))?;
    }
    Ok(vec![Checkpoint {
        name: v.name.to_owned(),
        dir,
    }])
}
