//! Prompt lookup decoding (provider id `prompt-lookup`): drafts by finding
//! the context's last n-gram earlier in the prompt or the generation and
//! proposing what followed it there. No weights, no model: it pays off when
//! the output repeats its input (code edits, summaries quoting the text,
//! retrieval answers).
//!
//! A request's predicted output (OpenAI's predicted outputs,
//! `OpenContext::prediction`) is a second place to look: followed in order,
//! its match wins unless the request's own is longer.
//!
//! After Saxena, "Prompt Lookup Decoding" (2023). The longest n-gram from
//! `max_ngram` down to `min_ngram` wins, and among equal lengths the most
//! recent occurrence; proposals are deterministic (`Draft::probs` is
//! `None`). The index is updated incrementally, so a round costs
//! O(new tokens × max_ngram²) hashing plus the draft's length, independent
//! of the context length.
#![warn(missing_docs)]

mod config;
mod index;
mod reference;
mod source;

use spec_core::{DraftProvider, DraftSource, OpenContext, ProviderOptions, SpecError, Target};

pub use config::{PromptLookupConfig, MAX_NGRAM_LIMIT, OPTION_KEYS};
pub use source::PromptLookupSource;

/// The provider's registered id.
pub const ID: &str = "prompt-lookup";

/// Draft tokens per round when a request names no count (and the
/// `num_draft` option is unset). Proposing costs a hash lookup, and on a
/// CPU a verify window of 16 tokens costs ~1.7 single-token forwards (a
/// GPU's costs even less), so inside a copied span long drafts pay many
/// times over; the serve loop's controller starts at 3 and doubles while
/// drafts are fully accepted, so a miss still costs a short round.
pub const DEFAULT_NUM_DRAFT: usize = 16;

/// Prompt lookup for any target: it needs nothing from the model, so one
/// provider serves every request with the same settings.
#[derive(Debug, Clone)]
pub struct PromptLookupProvider {
    config: PromptLookupConfig,
}

impl PromptLookupProvider {
    /// A provider with `config`, which must be valid.
    pub fn new(config: PromptLookupConfig) -> Result<Self, SpecError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// A provider configured by `options` (see `PromptLookupConfig`).
    pub fn from_options(options: &ProviderOptions) -> Result<Self, SpecError> {
        Self::new(PromptLookupConfig::from_options(options)?)
    }

    /// The provider's settings.
    pub fn config(&self) -> &PromptLookupConfig {
        &self.config
    }
}

impl DraftProvider for PromptLookupProvider {
    fn id(&self) -> &str {
        ID
    }

    fn default_num_draft(&self) -> usize {
        self.config.num_draft.unwrap_or(DEFAULT_NUM_DRAFT)
    }

    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(PromptLookupSource::new(self.config)?))
    }

    /// A source that drafts from the request's predicted output too
    /// ([`OpenContext::prediction`]).
    fn open_with<'a>(
        &self,
        _target: &'a dyn Target,
        context: &OpenContext,
    ) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(PromptLookupSource::with_prediction(
            self.config,
            &context.prediction,
        )?))
    }
}

spec_core::register_provider! {
    id: ID,
    description: "n-gram prompt lookup: drafts what followed the context's last n-gram earlier in the request",
    // The target plays no part.
    build: |_: &dyn Target, options: &ProviderOptions| PromptLookupProvider::from_options(options),
    request_options: config::REQUEST_OPTIONS,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the registered constructor does, without a target.
    fn build_from_options(options: &ProviderOptions) -> Result<Box<dyn DraftProvider>, SpecError> {
        Ok(Box::new(PromptLookupProvider::from_options(options)?))
    }

    #[test]
    fn registers_under_its_id() {
        let registration = spec_core::resolve(ID).expect("registered");
        assert_eq!(registration.id, "prompt-lookup");
        assert_eq!(registration.crate_name, "draft-prompt-lookup");
        assert!(!registration.description.is_empty() && !registration.description.contains('\n'));
    }

    #[test]
    fn build_parses_the_options() {
        let provider = build_from_options(&ProviderOptions::new()).expect("defaults build");
        assert_eq!(provider.id(), ID);

        let options: ProviderOptions = [("num_draft".to_owned(), "0".to_owned())]
            .into_iter()
            .collect();
        match build_from_options(&options) {
            Err(SpecError::Provider { id, message }) => {
                assert_eq!(id, ID);
                assert!(message.contains("`num_draft`"), "{message}");
            }
            other => panic!(
                "expected a provider error, got {:?}",
                other.map(|p| p.id().to_owned())
            ),
        }
    }

    #[test]
    fn provider_keeps_its_config() {
        let config = PromptLookupConfig {
            min_ngram: 1,
            max_ngram: 3,
            num_draft: Some(2),
        };
        let provider = PromptLookupProvider::new(config).expect("valid");
        assert_eq!(*provider.config(), config);
        assert!(PromptLookupProvider::new(PromptLookupConfig {
            min_ngram: 3,
            max_ngram: 2,
            num_draft: None
        })
        .is_err());
    }

    #[test]
    fn default_draft_count_is_long_unless_capped() {
        let provider = build_from_options(&ProviderOptions::new()).expect("defaults build");
        assert_eq!(provider.default_num_draft(), DEFAULT_NUM_DRAFT);
        let options: ProviderOptions = [("num_draft".to_owned(), "5".to_owned())]
            .into_iter()
            .collect();
        assert_eq!(
            build_from_options(&options)
                .expect("valid")
                .default_num_draft(),
            5,
            "the cap is the default"
        );
    }
}
