//! The EAGLE-3 head's quantization (`mlx-spec quantize-drafter`) on the
//! shared drafter policy (`spec_formats::quantize::drafter`): only
//! `LlamaForCausalLMEagle3` checkpoints; every Linear of the head (`fc`,
//! the layer's projections and MLP, `lm_head`, an own `embed_tokens`) whose
//! input divides by the group size is quantized. Nothing of a head is
//! compared against a threshold, so nothing is kept back; the vocabulary
//! maps (`d2t`, `t2d`: integers and booleans) and the norms are copied.
//! The smoke test reloads the output as stored and fuses one row of zero
//! features.

use std::path::Path;
use std::sync::Arc;

use spec_formats::quantize::drafter::{quantize_drafter, DrafterKind, DrafterOptions, SmokeFn};
use spec_formats::quantize::{QuantizeError, QuantizeReport};
use spec_runtime::{DtypePolicy, LoadOptions};

use crate::config::ARCHITECTURE;
use crate::Eagle3Model;

/// Quantizes the EAGLE-3 head at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_head_dir(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
) -> Result<QuantizeReport, QuantizeError> {
    let kind = DrafterKind {
        architecture: ARCHITECTURE,
        name: "EAGLE-3",
        predicate: None,
    };
    quantize_drafter(src, out, options, &kind)
}

/// Reloads the head as stored and fuses one row of zero features
/// (`[1, 1, 3 * target_hidden]`), which must give `[1, 1, hidden]`.
pub fn smoke() -> SmokeFn {
    Arc::new(|dir: &Path| {
        let options = LoadOptions {
            dtype: DtypePolicy::Keep,
            progress: None,
            expert_cache_bytes: None,
            mtp_expert_bits: None,
            kv_quantization: None,
            adapter: None,
            max_kv_size: None,
        };
        let model = Eagle3Model::load(dir, &options).map_err(|e| format!("reloading: {e}"))?;
        let config = model.config();
        let zeros = mlx_rs::ops::zeros::<f32>(&[1, 1, 3 * config.target_hidden])
            .map_err(|e| e.to_string())?;
        let projected = model.project(&zeros).map_err(|e| format!("fc: {e}"))?;
        projected.eval().map_err(|e| e.to_string())?;
        let expected = [1, 1, config.hidden];
        if projected.shape() != expected {
            return Err(format!(
                "fc on zeros gave {:?}, expected {expected:?}",
                projected.shape()
            ));
        }
        Ok(())
    })
}
