//! The DFlash drafter's quantization (`mlx-spec quantize-drafter`) on the
//! shared drafter policy (`spec_formats::quantize::drafter`): only
//! `DFlashDraftModel` checkpoints; every projection quantized (`fc`, the
//! attention and MLP projections; the norms stay float), and the smoke test
//! that reloads the output as stored and projects one row of zero taps.

use std::path::Path;
use std::sync::Arc;

use spec_formats::quantize::drafter::{quantize_drafter, DrafterKind, DrafterOptions, SmokeFn};
use spec_formats::quantize::{QuantizeError, QuantizeReport};
use spec_runtime::tap_context::TapContext;
use spec_runtime::{DtypePolicy, LoadOptions};

use crate::config::ARCHITECTURE;
use crate::DFlashModel;

/// Quantizes the DFlash drafter at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_drafter_dir(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
) -> Result<QuantizeReport, QuantizeError> {
    let kind = DrafterKind {
        architecture: ARCHITECTURE,
        name: "DFlash",
        predicate: None,
    };
    quantize_drafter(src, out, options, &kind)
}

/// Reloads the quantized drafter as stored and appends one row of zero taps
/// to a context, which must hold one row afterwards.
pub fn smoke() -> SmokeFn {
    Arc::new(|dir: &Path| {
        let options = LoadOptions {
            dtype: DtypePolicy::Keep,
            progress: None,
            expert_cache_bytes: None,
            mtp_expert_bits: None,
        };
        let model = DFlashModel::load(dir, &options).map_err(|e| format!("reloading: {e}"))?;
        let zeros = mlx_rs::ops::zeros::<f32>(&[1, 1, model.config().context_width()])
            .map_err(|e| e.to_string())?;
        let mut ctx = TapContext::default();
        model
            .extend_context(&mut ctx, &zeros)
            .map_err(|e| format!("extend_context: {e}"))?;
        if ctx.len() != 1 {
            return Err(format!("one row of taps gave {} context rows", ctx.len()));
        }
        Ok(())
    })
}
