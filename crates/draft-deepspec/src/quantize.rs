//! The DSpark drafter's quantization policy (the seed's
//! `quantize-drafter.ts`, `mlx-spec quantize-drafter`), on `spec_formats`'
//! quantizer: only `Gemma4DSparkModel` checkpoints; affine 4 or
//! 8 bits with group 32 or 64, or one of MLX's floating-point modes (mxfp4,
//! nvfp4, mxfp8) with its own group size and bits; every 2-D weight whose last dimension divides by the
//! group size is quantized (`embed_tokens` and `markov_head.markov_w1` too,
//! as quantized gather tables); `confidence_head.*` stays full precision (its
//! output is compared against a threshold, and it is tiny) and is recorded
//! `false`. Then the output is reloaded through the caller's smoke test.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use spec_formats::quantize::{
    check_params, quantize_dir, read_config_object, ModuleChoice, ModulePredicate, QuantizeError,
    QuantizeOptions, QuantizeReport, DEFAULT_MAX_SHARD_BYTES,
};
use spec_runtime::config::{QuantMode, QuantParams};
use spec_runtime::ProgressFn;

/// `architectures[0]` of a DSpark drafter checkpoint.
pub const DSPARK_ARCHITECTURE: &str = "Gemma4DSparkModel";
/// Bits the drafter policy offers in affine mode.
pub const DRAFTER_BITS: &[i32] = &[4, 8];
/// Group sizes the drafter policy offers in affine mode.
pub const DRAFTER_GROUP_SIZES: &[i32] = &[32, 64];

/// Reloads a written drafter and checks it runs; an error message on failure.
pub type SmokeFn = Arc<dyn Fn(&Path) -> Result<(), String> + Send + Sync>;

/// How to quantize a drafter.
#[derive(Clone)]
pub struct DrafterOptions {
    /// Mode, bits and group size (affine: 4 or 8 bits, group 32 or 64).
    pub params: QuantParams,
    /// Called after each source tensor: `(done, total)`.
    pub progress: Option<ProgressFn>,
    /// The load smoke test run on the output; `None` skips it.
    pub smoke: Option<SmokeFn>,
}

impl std::fmt::Debug for DrafterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrafterOptions")
            .field("params", &self.params)
            .field("progress", &self.progress.is_some())
            .field("smoke", &self.smoke.is_some())
            .finish()
    }
}

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
    let params = options.params;
    check_params("drafter", params)?;
    let affine_offered =
        DRAFTER_BITS.contains(&params.bits) && DRAFTER_GROUP_SIZES.contains(&params.group_size);
    if params.mode == QuantMode::Affine && !affine_offered {
        return Err(QuantizeError::PolicyParams {
            what: "drafter".into(),
            params,
            allowed: "affine 4|8 bits with group size 32|64, or mxfp4, nvfp4, mxfp8".into(),
        });
    }
    let (config_path, config) = read_config_object(src)?;
    let architecture = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str);
    if architecture != Some(DSPARK_ARCHITECTURE) {
        let found = architecture.map_or_else(|| "missing".to_owned(), |a| format!("`{a}`"));
        return Err(QuantizeError::WrongCheckpoint {
            path: config_path,
            message: format!(
                "architectures[0] is {found}, not `{DSPARK_ARCHITECTURE}`: quantize-drafter is for DSpark drafters; quantize a target model with `mlx-spec quantize`"
            ),
        });
    }
    let quantize_options = QuantizeOptions {
        params,
        predicate: Some(drafter_predicate()),
        progress: options.progress.clone(),
        max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
    };
    let report = quantize_dir(src, out, &quantize_options)?;
    if let Some(smoke) = &options.smoke {
        smoke(out).map_err(|message| QuantizeError::Smoke {
            path: out.to_path_buf(),
            message,
        })?;
    }
    Ok(report)
}
