//! Errors of loading and running a DFlash drafter, each naming the file, key
//! or value at fault.

use spec_runtime::drafter_error::{CarriesDrafterError, DrafterError};
use spec_runtime::ModelError;

/// What went wrong loading or running a DFlash checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum DFlashError {
    /// The config, the fit to the target or a forward's input is wrong.
    #[error(transparent)]
    Drafter(#[from] DrafterError),
    /// Loading a tensor failed (missing, mis-shaped, leftover), or a layer
    /// failed to run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// The target's embedding or head, or the request's sampler, failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
}

impl From<DFlashError> for spec_core::SpecError {
    fn from(e: DFlashError) -> Self {
        match e {
            DFlashError::Mlx(inner) => spec_core::SpecError::Mlx(inner),
            DFlashError::Model(ModelError::Mlx(inner)) => spec_core::SpecError::Mlx(inner),
            DFlashError::Model(ModelError::Spec(inner)) | DFlashError::Spec(inner) => inner,
            other => spec_core::SpecError::provider_failed(crate::ID, other),
        }
    }
}

/// Key errors are the shared drafter's.
impl CarriesDrafterError for DFlashError {}
