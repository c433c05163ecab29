//! Loading a model directory into the architecture its config names, or a
//! llama GGUF file.

use std::path::Path;

use spec_core::Target;
use spec_formats::gguf;
use spec_runtime::config::{read_config, ConfigHeader};
use spec_runtime::weights::Weights;

use crate::{architectures, llama, LoadOptions, ModelError};

/// A loaded target of any supported architecture.
pub type LoadedModel = Box<dyn Target + Send>;

/// Loads the model at `dir`: an mlx-lm / Hugging Face directory, or a `.gguf` file.
pub fn load_model(dir: &Path, options: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let _span = tracing::info_span!("load_model", path = %dir.display()).entered();
    if dir.extension().is_some_and(|x| x == "gguf") {
        if options.expert_cache_bytes.is_some() {
            return Err(ModelError::LoadOption {
                option: spec_runtime::experts::TIER_OPTION,
                message: "GGUF files load resident (no streamed experts)".into(),
            });
        }
        return Ok(Box::new(load_gguf(dir, options)?));
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

/// The streamed-expert store of a loaded model, if its routed experts
/// stream from disk (its counters: `ExpertStore::stats`).
pub fn expert_store(
    target: &dyn spec_core::Target,
) -> Option<std::sync::Arc<spec_runtime::experts::ExpertStore>> {
    let any = target.as_any();
    if let Some(m) = any.downcast_ref::<crate::glm::Model>() {
        return m.expert_store().cloned();
    }
    if let Some(m) = any.downcast_ref::<crate::qwen3_next::Model>() {
        return m.expert_store().cloned();
    }
    if let Some(m) = any.downcast_ref::<crate::llama::Model>() {
        return m.expert_store().cloned();
    }
    any.downcast_ref::<crate::gemma4::Model>()
        .and_then(|m| m.expert_store().cloned())
}

/// The MTP row's 8-bit expert tier of a loaded model (`--mtp-expert-bits`).
pub fn mtp_expert_tier(target: &dyn spec_core::Target) -> Option<crate::glm::MtpExpertTier> {
    target
        .as_any()
        .downcast_ref::<crate::glm::Model>()
        .and_then(crate::glm::Model::mtp_expert_tier)
}

/// Loads a llama GGUF file as a model (the llama family's options checks
/// first).
pub fn load_gguf(path: &Path, options: &LoadOptions) -> Result<llama::Model, ModelError> {
    if let Some(family) = crate::architectures::architecture("llama") {
        family.check_options(options)?;
    }
    let checkpoint = gguf::read(path, options.dtype)?;
    let weights = Weights::from_map(checkpoint.path.clone(), checkpoint.tensors);
    llama::Model::from_config_value(checkpoint.config, path, weights, options)
}
