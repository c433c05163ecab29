//! The gates' synthetic Gemma-4 assistant checkpoints on disk (layout and
//! echo-shaped weights in `spec_fixtures::assistant`) for the synthetic
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
//! The synthetic target repeats tokens often enough that the echoing drafts
//! are accepted, partially and fully, and rejected.

use std::path::Path;

use anyhow::{Context, Result};
use spec_fixtures::assistant::{self, Weights};

use crate::synth::{self, Checkpoint};

/// Bump when anything below changes what gets written.
const GENERATOR_VERSION: u32 = 2;

/// The target the assistants are shaped for, and its embedding tensor.
pub const TARGET: &str = "gemma4-shared";
const TARGET_EMBED: &str = "model.language_model.embed_tokens.weight";

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
    for v in assistant::GATE {
        let dir = base.join(v.name);
        let stamp = format!(
            "assistant generator {GENERATOR_VERSION}\nseed {:#x}\n{}\ntarget:\n{target_stamp}",
            synth::SEED,
            v.config()
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

/// Writes assistant `a` into `dir`, its echo shaped by the target's
/// embedding table.
fn write(a: &assistant::Assistant, target_dir: &Path, dir: &Path) -> Result<()> {
    let bytes = std::fs::read(target_dir.join("model.safetensors"))
        .with_context(|| format!("reading {}", target_dir.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("parsing {}", target_dir.display()))?;
    let (shape, target_embed) = synth::read_f32(&st, TARGET_EMBED)?;
    anyhow::ensure!(
        shape == [a.vocab, a.backbone],
        "{TARGET_EMBED} of {} is {shape:?}, expected [{}, {}]",
        target_dir.display(),
        a.vocab,
        a.backbone
    );
    a.write(
        dir,
        Weights::Echo {
            target_embed: &target_embed,
        },
    )?;
    Ok(())
}
