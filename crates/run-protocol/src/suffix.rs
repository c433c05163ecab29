//! `suffix_proposals` and `suffix_cache_trace`
//! (`crates/draft-suffix/examples/`): the suffix trie's proposals and a
//! provider's drafts over whole request histories. Their clients are gate
//! `suffix`'s oracle scripts (`xtask/python/suffix_oracle.py`,
//! `suffix_cache_oracle.py`), which write these requests and read these
//! reports.

use serde::{Deserialize, Serialize};

use crate::Request;

/// What `suffix_proposals` runs: operations on one trie, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrieRequest {
    /// The trie's depth.
    pub depth: usize,
    /// The operations.
    pub ops: Vec<TrieOp>,
}

/// One operation on the trie.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum TrieOp {
    /// Insert a sequence.
    Seq(Vec<u32>),
    /// Remove the k-th sequence inserted (from 0).
    Rm(usize),
    /// Propose after a context.
    Spec {
        /// Most tokens proposed.
        max_tokens: usize,
        /// `max_spec_factor`.
        factor: f32,
        /// `max_spec_offset`.
        offset: f32,
        /// `min_token_prob`.
        min_prob: f32,
        /// The context.
        context: Vec<u32>,
    },
}

impl Request for TrieRequest {
    const BINARY: &'static str = "suffix_proposals";
    type Report = TrieReport;
}

/// One proposal per [`TrieOp::Spec`], in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrieReport {
    /// The proposals.
    pub proposals: Vec<TrieProposal>,
}

/// A trie's proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrieProposal {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Each token's probability.
    pub probs: Vec<f32>,
    /// The proposal's score.
    pub score: f32,
    /// Length of the context suffix it matched.
    pub match_len: usize,
}

/// What `suffix_cache_trace` runs: recorded requests, one after another
/// (each completing before the next), through one `SuffixProvider`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheRequest {
    /// The provider's settings.
    pub config: CacheConfig,
    /// The requests.
    pub requests: Vec<Recorded>,
}

/// A `SuffixProvider`'s settings and draft count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// `max_depth`.
    pub depth: usize,
    /// `max_tree_tokens`: the global tree's budget.
    pub budget: usize,
    /// `max_spec_factor`.
    pub factor: f32,
    /// `max_spec_offset`.
    pub offset: f32,
    /// `min_token_prob`.
    pub min_prob: f32,
    /// Most drafts a round.
    pub num_draft: usize,
}

/// A request's prompt and recorded output (drafts are accepted greedily
/// against it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recorded {
    /// The prompt.
    pub prompt: Vec<u32>,
    /// The output.
    pub output: Vec<u32>,
}

impl Request for CacheRequest {
    const BINARY: &'static str = "suffix_cache_trace";
    type Report = CacheReport;
}

/// Per request, its rounds and what the global tree held after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheReport {
    /// In request order.
    pub requests: Vec<CacheTrace>,
}

/// One request's drafts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheTrace {
    /// Each round's draft.
    pub rounds: Vec<CacheRound>,
    /// The requests (by index) the global tree holds after this one.
    pub cached: Vec<usize>,
}

/// One round's draft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheRound {
    /// Output tokens committed before it.
    pub pos: usize,
    /// Most tokens it could propose.
    pub max: usize,
    /// The tokens proposed.
    pub tokens: Vec<u32>,
}
