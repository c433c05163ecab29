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
//! in tokens (`max_tree_tokens`) rather than in requests, and evicts the
//! least recently used request rather than the oldest; a request joins it
//! when its source is told the request completed
//! (`DraftSource::finish(Completed)`) rather than token by token while it
//! runs, so only committed tokens of completed requests ever enter. The
//! trie itself proposes exactly what arctic-inference 0.3.0's
//! `SuffixTree::speculate` proposes (path mode), ties between equal counts
//! included (gate `suffix` compares them, and whole histories at the
//! cache level).
//!
//! **Invariant:** a request's tokens reach the global tree only when it
//! completed, and with `global_per_tenant` only its own tenant's tree.
#![warn(missing_docs)]

mod config;
mod global;
mod source;
mod trie;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use spec_core::{DraftProvider, DraftSource, OpenContext, ProviderOptions, SpecError, Target};

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

/// A global tree shared by the sources drafting from it.
pub type SharedTree = Arc<RwLock<GlobalTree>>;

/// Suffix decoding for any target; one provider's global trie serves
/// every request it opens (or, with `global_per_tenant`, every request of
/// one tenant).
#[derive(Debug, Clone)]
pub struct SuffixProvider {
    config: SuffixConfig,
    /// Requests without a tenant, or every request unless per tenant.
    global: SharedTree,
    /// With `global_per_tenant`: each tenant's tree, made on first use.
    tenants: Arc<Mutex<HashMap<String, SharedTree>>>,
}

impl SuffixProvider {
    /// A provider with `config`, which must be valid, and an empty global
    /// trie.
    pub fn new(config: SuffixConfig) -> Result<Self, SpecError> {
        config.validate()?;
        Ok(Self {
            config,
            global: Self::tree(&config),
            tenants: Arc::default(),
        })
    }

    fn tree(config: &SuffixConfig) -> SharedTree {
        Arc::new(RwLock::new(GlobalTree::new(
            config.max_depth,
            config.max_tree_tokens,
        )))
    }

    /// A provider configured by `options` (see `SuffixConfig`).
    pub fn from_options(options: &ProviderOptions) -> Result<Self, SpecError> {
        Self::new(SuffixConfig::from_options(options)?)
    }

    /// The provider's settings.
    pub fn config(&self) -> &SuffixConfig {
        &self.config
    }

    /// The global trie every source shares (with `global_per_tenant`:
    /// the one of requests without a tenant).
    pub fn global(&self) -> &SharedTree {
        &self.global
    }

    /// The global trie a request of `tenant` drafts from and joins.
    pub fn global_for(&self, tenant: Option<&str>) -> SharedTree {
        match tenant {
            Some(tenant) if self.config.global_per_tenant => Arc::clone(
                self.tenants
                    .lock()
                    .entry(tenant.to_owned())
                    .or_insert_with(|| Self::tree(&self.config)),
            ),
            _ => Arc::clone(&self.global),
        }
    }

    /// A source for one request without a tenant.
    pub fn source(&self) -> SuffixSource {
        self.source_for(None)
    }

    /// A source for one request of `tenant`.
    pub fn source_for(&self, tenant: Option<&str>) -> SuffixSource {
        SuffixSource::new(self.config, self.global_for(tenant))
    }
}

impl DraftProvider for SuffixProvider {
    fn id(&self) -> &str {
        ID
    }

    fn default_num_draft(&self) -> usize {
        self.config.num_draft.unwrap_or(DEFAULT_NUM_DRAFT)
    }

    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.source()))
    }

    fn open_with<'a>(
        &self,
        _target: &'a dyn Target,
        context: &OpenContext,
    ) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(
            self.source_for(context.tenant.as_deref())
                .with_prediction(&context.prediction),
        ))
    }
}

spec_core::register_provider! {
    id: ID,
    description: "suffix decoding: drafts from suffix trees over the request and earlier requests' outputs",
    // The target plays no part.
    build: |_: &dyn Target, options: &ProviderOptions| SuffixProvider::from_options(options),
    request_options: config::REQUEST_OPTIONS,
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

    #[test]
    fn tenants_get_their_own_tree_unless_the_operator_shares_it() {
        let shared = SuffixProvider::new(SuffixConfig {
            global_per_tenant: false,
            ..Default::default()
        })
        .expect("valid");
        assert!(Arc::ptr_eq(
            &shared.global_for(Some("a")),
            &shared.global_for(Some("b"))
        ));
        assert!(Arc::ptr_eq(&shared.global_for(Some("a")), shared.global()));
        // The default keeps tenants apart.
        let apart = SuffixProvider::new(SuffixConfig::default()).expect("valid");
        let a = apart.global_for(Some("a"));
        assert!(Arc::ptr_eq(&a, &apart.global_for(Some("a"))));
        assert!(!Arc::ptr_eq(&a, &apart.global_for(Some("b"))));
        assert!(!Arc::ptr_eq(&a, apart.global()));
        assert!(Arc::ptr_eq(&apart.global_for(None), apart.global()));
    }
}
