//! The drafter quantization policy (`mlx-spec quantize-drafter`), shared by
//! the drafter crates: affine 4 or 8 bits with group 32 or 64, or one of
//! MLX's floating-point modes; every 2-D weight whose last dimension divides
//! by the group size is quantized unless the drafter's predicate keeps it;
//! only checkpoints of the drafter's architecture; then the output is
//! reloaded through the caller's smoke test.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use spec_runtime::config::{QuantMode, QuantParams};
use spec_runtime::ProgressFn;

use super::{
    check_params, quantize_dir, read_config_object, ModulePredicate, QuantizeError,
    QuantizeOptions, QuantizeReport, DEFAULT_MAX_SHARD_BYTES,
};

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

/// What one drafter crate's policy adds: its checkpoints' architecture, a
/// name for messages and the modules it keeps full precision.
#[derive(Clone)]
pub struct DrafterKind {
    /// `architectures[0]` of its checkpoints.
    pub architecture: &'static str,
    /// What its drafters are called (`DSpark`, `DFlash`).
    pub name: &'static str,
    /// Modules kept full precision (`None`: every eligible one quantized).
    pub predicate: Option<ModulePredicate>,
}

impl std::fmt::Debug for DrafterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrafterKind")
            .field("architecture", &self.architecture)
            .field("name", &self.name)
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

/// `architectures[0]` of the checkpoint at `src`, when it has one.
pub fn architecture(src: &Path) -> Result<Option<String>, QuantizeError> {
    let (_, config) = read_config_object(src)?;
    Ok(config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_owned))
}

/// Quantizes the `kind` drafter at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_drafter(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
    kind: &DrafterKind,
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
    let (config_path, _) = read_config_object(src)?;
    let found = architecture(src)?;
    if found.as_deref() != Some(kind.architecture) {
        let found = found.map_or_else(|| "missing".to_owned(), |a| format!("`{a}`"));
        return Err(QuantizeError::WrongCheckpoint {
            path: config_path,
            message: format!(
                "architectures[0] is {found}, not `{}`: quantize-drafter's {} policy takes only those; quantize a target model with `mlx-spec quantize`",
                kind.architecture, kind.name
            ),
        });
    }
    let quantize_options = QuantizeOptions {
        params,
        predicate: kind.predicate.clone(),
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
