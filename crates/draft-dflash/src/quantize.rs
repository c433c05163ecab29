//! The DFlash drafter's quantization (`mlx-spec quantize-drafter`) on the
//! shared drafter policy (`spec_formats::quantize::drafter`): only
//! `DFlashDraftModel` and `DFlash2DraftModel` checkpoints; every projection
//! quantized (`fc`, the attention and MLP projections, DFlash2's
//! convolutions' `kernel_projection`), the norms float; DFlash2's
//! threshold-sensitive selector parts stay float too: its codebooks and the
//! convolutions' `base_kernel` are not Linear weights (kept by the rule),
//! and `candidate_selector.hidden_projection` (a small `[R, H]` matrix whose
//! scores pick among the candidates) is excluded. Then the smoke test that
//! reloads the output as stored and projects one row of zero taps.

use std::path::Path;
use std::sync::Arc;

use spec_formats::quantize::drafter::{
    architecture, quantize_drafter, DrafterKind, DrafterOptions, SmokeFn,
};
use spec_formats::quantize::{ModuleChoice, ModulePredicate, QuantizeError, QuantizeReport};
use spec_runtime::tap_context::TapContext;
use spec_runtime::{DtypePolicy, LoadOptions};

use crate::config::{ARCHITECTURE, ARCHITECTURE_2};
use crate::DFlashModel;

/// Quantizes the DFlash drafter at `src` into the new directory `out`, then
/// runs the smoke test on it unless `options.smoke` is `None`.
pub fn quantize_drafter_dir(
    src: &Path,
    out: &Path,
    options: &DrafterOptions,
) -> Result<QuantizeReport, QuantizeError> {
    let kind = if architecture(src)?.as_deref() == Some(ARCHITECTURE_2) {
        DrafterKind {
            architecture: ARCHITECTURE_2,
            name: "DFlash2",
            predicate: Some(dflash2_predicate()),
        }
    } else {
        DrafterKind {
            architecture: ARCHITECTURE,
            name: "DFlash",
            predicate: None,
        }
    };
    quantize_drafter(src, out, options, &kind)
}

/// DFlash2's module predicate: the selector's `hidden_projection` kept
/// float, the rest quantized (where the shape allows).
pub fn dflash2_predicate() -> ModulePredicate {
    Arc::new(|module: &str| {
        if module == "candidate_selector.hidden_projection" {
            ModuleChoice::Exclude
        } else {
            ModuleChoice::Quantize
        }
    })
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
            kv_quantization: None,
            adapter: None,
            max_kv_size: None,
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
