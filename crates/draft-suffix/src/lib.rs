//! Suffix decoding (provider id `suffix`): drafts from a suffix trie over
//! the request's prompt and committed output, and from a global trie over
//! earlier requests' committed outputs shared by every request the
//! provider serves. No weights, no model: it pays off where outputs repeat
//! across requests (agent loops, tool calls, SQL, code edits).
//!
//! After Oliaro et al., "SuffixDecoding" (arXiv 2411.04975), as
//! ArcticInference 0.3.0 implements it (`SuffixDecodingCache`, greedy path
//! proposals): for each match length `m` of the context's suffix found in
//! a trie, the most frequent continuation is followed while its estimated
//! probability (product of `count(child) / count(node)`) stays at or above
//! `min_token_prob`, for at most `floor(m * max_spec_factor +
//! max_spec_offset)` tokens; the proposal with the highest score (the sum
//! of its probabilities) wins, the local trie's unless the global's is
//! strictly higher. Options: see [`SuffixConfig`].
//!
//! Differences from the reference, by design: the global trie is bounded
//! in tokens (`max_tree_tokens`) rather than in requests; a request joins
//! it when its source ends cleanly rather than token by token while it
//! runs (only committed tokens of requests that ran to the end ever
//! enter). The trie itself proposes exactly what arctic-inference 0.3.0's
//! `SuffixTree::speculate` proposes (path mode), ties between equal counts
//! included (`xtask/python/suffix_oracle.py` compares them).
//!
//! Not offered: keeping the global trie per API key. A provider opens a
//! source with the target only (`DraftProvider::open`), so it cannot see
//! which key a request came with; that needs the key in `open`.
#![warn(missing_docs)]

mod config;
mod global;
mod source;
mod trie;

use std::sync::Arc;

use parking_lot::RwLock;
use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};

pub use config::{SuffixConfig, MAX_DEPTH_LIMIT, OPTION_KEYS};
pub use global::GlobalTree;
pub use source::{Origin, SuffixSource};
pub use trie::{Cursor, PathDraft, SpecLimits, SuffixTrie};

/// The provider's registered id.
pub const ID: &str = "suffix";

/// Draft tokens per round when a request names no count (and `num_draft`
/// is unset): proposing costs a trie walk, and the match-length cap and the
/// probability cut-off already keep weak proposals short.
pub const DEFAULT_NUM_DRAFT: usize = 16;

/// Suffix decoding for any target; one provider's global trie serves
/// every request it opens.
#[derive(Debug, Clone)]
pub struct SuffixProvider {
    config: SuffixConfig,
    global: Arc<RwLock<GlobalTree>>,
}

impl SuffixProvider {
    /// A provider with `config`, which must be valid, and an empty global
    /// trie.
    pub fn new(config: SuffixConfig) -> Result<Self, SpecError> {
        config.validate()?;
        Ok(Self {
            config,
            global: Arc::new(RwLock::new(GlobalTree::new(
                config.max_depth,
                config.max_tree_tokens,
            ))),
        })
    }

    /// A provider configured by `options` (see `SuffixConfig`).
    pub fn from_options(options: &ProviderOptions) -> Result<Self, SpecError> {
        Self::new(SuffixConfig::from_options(options)?)
    }

    /// The provider's settings.
    pub fn config(&self) -> &SuffixConfig {
        &self.config
    }

    /// The global trie every source shares.
    pub fn global(&self) -> &Arc<RwLock<GlobalTree>> {
        &self.global
    }

    /// A source for one request.
    pub fn source(&self) -> SuffixSource {
        SuffixSource::new(self.config, Arc::clone(&self.global))
    }
}

impl DraftProvider for SuffixProvider {
    fn id(&self) -> &str {
        ID
    }

    fn default_num_draft(&self) -> usize {
        self.config.num_draft.unwrap_or(DEFAULT_NUM_DRAFT)
    }

    fn open<'a>(&'a self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.source()))
    }
}

spec_core::register_provider! {
    id: ID,
    description: "suffix decoding: drafts from suffix trees over the request and earlier requests' outputs",
    // The target plays no part.
    build: |_: &dyn Target, options: &ProviderOptions| SuffixProvider::from_options(options),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_under_its_id() {
        let registration = spec_core::resolve(ID).expect("registered");
        assert_eq!(registration.id, "suffix");
        assert_eq!(registration.crate_name, "draft-suffix");
        assert!(!registration.description.contains('\n'));
    }

    #[test]
    fn options_reach_the_provider() {
        let options: ProviderOptions = [("num_draft", "5"), ("max_depth", "8")].into();
        let provider = SuffixProvider::from_options(&options).expect("valid");
        assert_eq!(provider.default_num_draft(), 5);
        assert_eq!(provider.config().max_depth, 8);
        let defaults = SuffixProvider::from_options(&ProviderOptions::new()).expect("valid");
        assert_eq!(defaults.default_num_draft(), DEFAULT_NUM_DRAFT);
        let bad: ProviderOptions = [("min_token_prob", "2")].into();
        assert!(matches!(
            SuffixProvider::from_options(&bad),
            Err(SpecError::Provider { id, .. }) if id == ID
        ));
    }
}
