//! The DSpark drafter's quantization format (`mlx-spec quantize-drafter`)
//! on the shared drafter policy (`spec_formats::quantize::drafter`): only
//! `Gemma4DSparkModel` checkpoints; every 2-D weight whose last dimension
//! divides by the group size is quantized (`embed_tokens` and
//! `markov_head.markov_w1` too, as quantized gather tables);
//! `confidence_head.*` stays full precision (its output is compared against
//! a threshold, and it is tiny) and is recorded `false`.

use std::path::Path;
use std::sync::Arc;

use spec_formats::quantize::drafter::{quantize_drafter, DrafterFormat};
use spec_formats::quantize::{ModuleChoice, ModulePredicate, QuantizeError, QuantizeReport};

pub use spec_formats::quantize::drafter::{
    DrafterOptions, SmokeFn, DRAFTER_BITS, DRAFTER_GROUP_SIZES,
};

/// `architectures[0]` of a DSpark drafter checkpoint.
pub const DSPARK_ARCHITECTURE: &str = "Gemma4DSparkModel";

/// The format's module predicate: `confidence_head.*` excluded, the rest
/// quantized (where the shape allows).
pub fn drafter_predicate() -> ModulePredicate {
    Arc::new(|module: &str| {
        if module.split('.').any(|part| part == "confidence_head") {
            ModuleChoice::Exclude
        } else {
            ModuleChoice::Quantize
        }
    })
}

/// The DSpark drafter format.
pub fn format() -> DrafterFormat {
    DrafterFormat {
        architecture: DSPARK_ARCHITECTURE,
        name: "DSpark drafters",
        predicate: drafter_predicate(),
    }
}

/// Quantizes the DSpark drafter at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_drafter_dir(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
) -> Result<QuantizeReport, QuantizeError> {
    quantize_drafter(&format(), src, out, options)
}
