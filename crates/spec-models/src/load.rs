//! Loading a model directory into the architecture its config names.

use std::path::Path;

use crate::config::{read_config, ConfigHeader};
use spec_core::Target;

use crate::{architectures, ModelError};

/// Which dtype the weights run in (spec-core's, so that a provider's
/// `dtype` option reads straight into it).
pub use spec_core::DtypePolicy;

/// Called as layers finish loading: `(layers done, layers in all)`.
pub type ProgressFn = std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Options of `load_model`.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Weight dtype policy.
    pub dtype: DtypePolicy,
    /// Progress callback (a CLI's progress bar).
    pub progress: Option<ProgressFn>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("dtype", &self.dtype)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// A loaded target of any supported architecture.
pub type LoadedModel = Box<dyn Target + Send>;

/// Loads the model at `dir`: an mlx-lm / Hugging Face directory, or a `.gguf` file.
pub fn load_model(dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let _span = tracing::info_span!("load_model", path = %dir.display()).entered();
    if dir.extension().is_some_and(|x| x == "gguf") {
        return Ok(Box::new(crate::gguf::load(dir, options)?));
    }
    if !dir.exists() {
        return Err(ModelError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such model directory or file",
            ),
        });
    }
    let (header, path): (ConfigHeader, _) = read_config(dir)?;
    match architectures::architecture(&header.model_type) {
        Some(family) => family.load(dir, options),
        None => Err(ModelError::UnsupportedArchitecture {
            path,
            model_type: header.model_type,
            supported: architectures::supported().join(", "),
        }),
    }
}
