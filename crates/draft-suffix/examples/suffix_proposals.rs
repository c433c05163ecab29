//! Our suffix trie's proposals for a script of operations, for
//! `xtask/python/suffix_oracle.py` to compare with ArcticInference's
//! `SuffixTree`.
//!
//! `suffix_proposals REQUEST.json`: a `run_protocol::suffix::TrieRequest`
//! (a new trie of `depth`, then `seq` inserts a sequence, `rm` removes the
//! k-th inserted, `spec` proposes after a context); reports one proposal per
//! `spec` (`TrieReport`, on standard output).

use anyhow::{Context, Result};
use draft_suffix::{SpecLimits, SuffixTrie};
use run_protocol::suffix::{TrieOp, TrieProposal, TrieReport, TrieRequest};

fn main() -> Result<()> {
    let request: TrieRequest = run_protocol::read_request()?;
    let mut trie = SuffixTrie::new(request.depth);
    let mut seqs: Vec<&[u32]> = Vec::new();
    let mut proposals = Vec::new();
    for (i, op) in request.ops.iter().enumerate() {
        match op {
            TrieOp::Seq(tokens) => {
                trie.insert(tokens);
                seqs.push(tokens);
            }
            TrieOp::Rm(k) => {
                let seq = seqs
                    .get(*k)
                    .with_context(|| format!("op {i}: no sequence {k}"))?;
                trie.remove(seq);
            }
            TrieOp::Spec {
                max_tokens,
                factor,
                offset,
                min_prob,
                context,
            } => {
                let limits = SpecLimits {
                    max_tokens: *max_tokens,
                    max_spec_factor: *factor,
                    max_spec_offset: *offset,
                    min_token_prob: *min_prob,
                };
                let draft = trie.speculate(context, limits);
                proposals.push(TrieProposal {
                    tokens: draft.tokens,
                    probs: draft.probs,
                    score: draft.score,
                    match_len: draft.match_len,
                });
            }
        }
    }
    run_protocol::write_report::<TrieRequest>(&TrieReport { proposals })?;
    Ok(())
}
