//! Errors of loading and running a DSpark drafter, each naming the file, key
//! or value at fault.

use std::path::PathBuf;

use spec_runtime::drafter_error::{CarriesDrafterError, DrafterError};
use spec_runtime::ModelError;

/// What went wrong loading or running a DSpark checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum DSparkError {
    /// The config, the fit to the target or a forward's input is wrong.
    #[error(transparent)]
    Drafter(#[from] DrafterError),
    /// The checkpoint is not a DSpark drafter.
    #[error(
        "{path}: not a DSpark checkpoint (architectures {found}, expected [\"Gemma4DSparkModel\"])"
    )]
    NotDSpark {
        /// The config file.
        path: PathBuf,
        /// What `architectures` holds.
        found: String,
    },
    /// Loading a tensor failed (missing, mis-shaped, leftover), or a layer
    /// failed to run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An MLX operation failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// The request's sampler failed.
    #[error(transparent)]
    Spec(#[from] spec_core::SpecError),
}

impl From<DSparkError> for spec_core::SpecError {
    fn from(e: DSparkError) -> Self {
        match e {
            DSparkError::Mlx(inner) => spec_core::SpecError::Mlx(inner),
            DSparkError::Model(ModelError::Mlx(inner)) => spec_core::SpecError::Mlx(inner),
            DSparkError::Model(ModelError::Spec(inner)) | DSparkError::Spec(inner) => inner,
            other => spec_core::SpecError::provider_failed(crate::ID, other),
        }
    }
}

/// Key errors are the shared drafter's.
impl CarriesDrafterError for DSparkError {}
