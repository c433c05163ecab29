//! The DSpark drafter's quantization policy (the seed's
//! `quantize-drafter.ts`, `mlx-spec quantize-drafter`), on `spec_formats`'
//! drafter policy (`spec_formats::quantize::drafter`): only `Gemma4DSparkModel` checkpoints; affine 4 or
//! 8 bits with group 32 or 64, or one of MLX's floating-point modes (mxfp4,
//! nvfp4, mxfp8) with its own group size and bits; every 2-D weight whose last dimension divides by the
//! group size is quantized (`embed_tokens` and `markov_head.markov_w1` too,
//! as quantized gather tables); `confidence_head.*` stays full precision (its
//! output is compared against a threshold, and it is tiny) and is recorded
//! `false`. Then the output is reloaded through the caller's smoke test.

use std::path::Path;
use std::sync::Arc;

use spec_formats::quantize::drafter::{quantize_drafter, DrafterKind};
pub use spec_formats::quantize::drafter::{
    DrafterOptions, SmokeFn, DRAFTER_BITS, DRAFTER_GROUP_SIZES,
};
use spec_formats::quantize::{ModuleChoice, ModulePredicate, QuantizeError, QuantizeReport};

/// `architectures[0]` of a DSpark drafter checkpoint.
pub const DSPARK_ARCHITECTURE: &str = "Gemma4DSparkModel";

/// The policy's module predicate: `confidence_head.*` excluded, the rest
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

/// Quantizes the DSpark drafter at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_drafter_dir(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
) -> Result<QuantizeReport, QuantizeError> {
    let kind = DrafterKind {
        architecture: DSPARK_ARCHITECTURE,
        name: "DSpark",
        predicate: Some(drafter_predicate()),
    };
    quantize_drafter(src, out, options, &kind)
}
