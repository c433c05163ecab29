//! The EAGLE-3 head's quantization format (`mlx-spec quantize-drafter`) on
//! the shared drafter policy (`spec_formats::quantize::drafter`): only
//! `LlamaForCausalLMEagle3` checkpoints; every Linear of the head (`fc`,
//! the layer's projections and MLP, `lm_head`, an own `embed_tokens`) whose
//! input divides by the group size is quantized. Nothing of a head is
//! compared against a threshold, so nothing is kept back; the vocabulary
//! maps (`d2t`, `t2d`: integers and booleans) and the norms are copied.

use std::path::Path;
use std::sync::Arc;

use spec_formats::quantize::drafter::{quantize_drafter, DrafterFormat, DrafterOptions};
use spec_formats::quantize::{ModuleChoice, QuantizeError, QuantizeReport};

use crate::config::ARCHITECTURE;

/// The EAGLE-3 head format.
pub fn format() -> DrafterFormat {
    DrafterFormat {
        architecture: ARCHITECTURE,
        name: "EAGLE-3 heads",
        predicate: Arc::new(|_: &str| ModuleChoice::Quantize),
    }
}

/// Quantizes the EAGLE-3 head at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_head_dir(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
) -> Result<QuantizeReport, QuantizeError> {
    quantize_drafter(&format(), src, out, options)
}
