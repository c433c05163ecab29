//! Draft provider `draft-model`: any small model with the target's
//! vocabulary proposes tokens one by one from its own KV cache, rewound after
//! verification with mlx-lm's rule (`speculative_generate_step`): the draft
//! cache drops `max(drafted - accepted - 1, 0)` rows, and after a fully
//! accepted round the last draft is fed again with the bonus token.
//!
//! Options: `model` (path of the drafter: mlx-lm directory or GGUF;
//! required), `dtype` (`f32`, the default, or `keep`).
//!
//! A source's state after prefill (the drafter's cache) is saved for a
//! host's prefix cache and persists as a prompt-cache file of the drafter
//! (`spec_formats::prompt_cache`, fingerprinted with the drafter), which
//! [`DraftProvider::load_saved`] reads back for the same drafter only.
#![warn(missing_docs)]

mod source;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SavedDraft, SpecError, Target};
use spec_formats::prompt_cache::{self, ModelIdentity};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, DtypePolicy, LoadOptions};

pub use source::DraftModelSource;

/// The registered id.
pub const ID: &str = "draft-model";

fn provider_error(message: impl Into<String>) -> SpecError {
    SpecError::Provider {
        id: ID.to_owned(),
        message: message.into(),
    }
}

/// A drafter model loaded for one target.
#[derive(Debug)]
pub struct DraftModelProvider {
    /// Shared with the sources it opened, which may outlive it.
    model: Rc<dyn Target>,
    /// The drafter as its persisted states name it; `None`: states are not
    /// persisted.
    identity: Option<Arc<ModelIdentity>>,
}

/// What the options of `draft-model` say.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The drafter checkpoint.
    pub model: PathBuf,
    /// Its weight dtype policy.
    pub dtype: DtypePolicy,
}

impl Options {
    /// Parses and checks the option map.
    pub fn parse(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, &["model", "dtype"])?;
        Ok(Self {
            model: options.model()?,
            dtype: options.dtype()?,
        })
    }
}

impl DraftModelProvider {
    /// Loads the drafter and checks it against the target.
    pub fn new(target: &dyn Target, options: &Options) -> Result<Self, SpecError> {
        let model = load_model(
            &options.model,
            &LoadOptions {
                dtype: options.dtype,
                ..LoadOptions::default()
            },
        )
        .map_err(|e| SpecError::provider_failed(ID, e))?;
        // Without a fingerprint the states simply do not persist.
        let identity = match ModelIdentity::new(
            options.model.display().to_string(),
            &options.model,
            options.dtype,
            None,
        ) {
            Ok(identity) => Some(Arc::new(identity)),
            Err(e) => {
                tracing::warn!(
                    drafter = %options.model.display(),
                    error = %spec_core::error::report(&e),
                    "draft-model states will not persist: the drafter has no fingerprint"
                );
                None
            }
        };
        let provider = Self {
            model: Rc::<dyn Target + Send>::from(model),
            identity,
        };
        provider.check(target)?;
        Ok(provider)
    }

    /// Wraps an already loaded drafter (its states are not persisted: no
    /// path names it).
    pub fn from_model(model: Model) -> Result<Self, SpecError> {
        Ok(Self {
            model: Rc::<dyn Target + Send>::from(model),
            identity: None,
        })
    }

    fn check(&self, target: &dyn Target) -> Result<(), SpecError> {
        let (ours, theirs) = (self.model.info().vocab_size, target.info().vocab_size);
        if ours != theirs {
            return Err(provider_error(format!(
                "the drafter's vocabulary ({ours} tokens) differs from the target's ({theirs})"
            )));
        }
        Ok(())
    }
}

impl DraftProvider for DraftModelProvider {
    fn id(&self) -> &str {
        ID
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        self.check(target)?;
        Ok(Box::new(
            DraftModelSource::new(Rc::clone(&self.model)).persisting_as(self.identity.clone()),
        ))
    }

    /// Reads a drafter cache persisted by [`SavedDraft::persist`]: a
    /// prompt-cache file of this drafter (another drafter's file is refused
    /// by its fingerprint) whose tokens begin `tokens`.
    fn load_saved(
        &self,
        path: &Path,
        tokens: &[u32],
    ) -> Result<Option<Box<dyn SavedDraft>>, SpecError> {
        let Some(identity) = &self.identity else {
            return Ok(None);
        };
        let loaded = prompt_cache::load_prompt_cache(path, self.model.as_ref(), identity)
            .map_err(|e| SpecError::provider_failed(ID, e))?;
        match loaded.tokens {
            Some(saved) if tokens.starts_with(&saved) && !saved.is_empty() => Ok(Some(
                source::saved_caches(loaded.caches, saved, Arc::clone(identity)),
            )),
            _ => Ok(None),
        }
    }
}

fn build(target: &dyn Target, options: &ProviderOptions) -> Result<DraftModelProvider, SpecError> {
    DraftModelProvider::new(target, &Options::parse(options)?)
}

spec_core::register_provider! {
    id: ID,
    description: "a small model of the same vocabulary drafts token by token (mlx-lm's --draft-model)",
    build: build,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Options, String> {
        Options::parse(&pairs.iter().copied().collect()).map_err(|e| e.to_string())
    }

    #[test]
    fn options_name_the_provider_and_the_key() {
        assert_eq!(
            parse(&[("model", "/d"), ("dtype", "keep")]),
            Ok(Options {
                model: PathBuf::from("/d"),
                dtype: DtypePolicy::Keep,
            })
        );
        assert_eq!(
            parse(&[("model", "/d")]).map(|o| o.dtype),
            Ok(DtypePolicy::Float32)
        );
        assert_eq!(
            parse(&[("model", "/d"), ("gamma", "3")]),
            Err(
                "draft provider `draft-model`: unknown option `gamma` = `3` \
                 (known options: dtype, model)"
                    .to_owned()
            )
        );
        assert_eq!(
            parse(&[]),
            Err("draft provider `draft-model`: option `model` \
                 (the drafter checkpoint's path) is required"
                .to_owned())
        );
        assert_eq!(
            parse(&[("model", "/d"), ("dtype", "f16")]),
            Err(
                "draft provider `draft-model`: option `dtype` = `f16`: expected f32 or keep"
                    .to_owned()
            )
        );
    }
}
