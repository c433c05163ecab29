//! The global tree: a suffix trie over finished requests' committed
//! tokens, bounded by a token budget and evicting whole requests, oldest
//! first.

use std::collections::VecDeque;

use crate::trie::SuffixTrie;

/// Finished requests' tokens and their trie.
#[derive(Debug, Clone)]
pub struct GlobalTree {
    trie: SuffixTrie,
    /// Each cached request's tokens, oldest first.
    requests: VecDeque<Vec<u32>>,
    /// Tokens held by `requests`.
    tokens: usize,
    budget: usize,
}

impl GlobalTree {
    /// An empty tree holding at most `budget` tokens (0: it holds none).
    pub fn new(max_depth: usize, budget: usize) -> Self {
        Self {
            trie: SuffixTrie::new(max_depth),
            requests: VecDeque::new(),
            tokens: 0,
            budget,
        }
    }

    /// The trie to draft from.
    pub fn trie(&self) -> &SuffixTrie {
        &self.trie
    }

    /// Tokens cached.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Requests cached.
    pub fn requests(&self) -> usize {
        self.requests.len()
    }

    /// Adds one finished request's tokens, evicting the oldest requests
    /// while the budget would be exceeded; a request longer than the
    /// budget keeps its last `budget` tokens.
    pub fn add(&mut self, tokens: &[u32]) {
        let kept = &tokens[tokens.len().saturating_sub(self.budget)..];
        if kept.is_empty() {
            return;
        }
        while self.tokens + kept.len() > self.budget {
            let Some(oldest) = self.requests.pop_front() else {
                break;
            };
            self.trie.remove(&oldest);
            self.tokens -= oldest.len();
        }
        self.trie.insert(kept);
        self.tokens += kept.len();
        self.requests.push_back(kept.to_vec());
        tracing::debug!(
            added = kept.len(),
            tokens = self.tokens,
            requests = self.requests.len(),
            nodes = self.trie.nodes(),
            "suffix global tree updated"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trie::SpecLimits;

    fn draft(tree: &GlobalTree, context: &[u32]) -> Vec<u32> {
        let limits = SpecLimits {
            max_tokens: 8,
            max_spec_factor: 1.0,
            max_spec_offset: 0.0,
            min_token_prob: 0.1,
        };
        tree.trie().speculate(context, limits).tokens
    }

    #[test]
    fn whole_requests_are_evicted_oldest_first_under_the_budget() {
        let mut tree = GlobalTree::new(8, 10);
        tree.add(&[1, 2, 3, 4]);
        tree.add(&[5, 6, 7, 8]);
        assert_eq!((tree.tokens(), tree.requests()), (8, 2));
        assert_eq!(draft(&tree, &[9, 1, 2]), [3, 4]);
        // 8 + 3 > 10: the first request goes, whole.
        tree.add(&[10, 11, 12]);
        assert_eq!((tree.tokens(), tree.requests()), (7, 2));
        assert_eq!(tree.trie().tokens(), 7);
        assert_eq!(draft(&tree, &[9, 1, 2]), Vec::<u32>::new());
        assert_eq!(draft(&tree, &[9, 5, 6]), [7, 8]);
        // Longer than the budget: its last 10 tokens replace everything.
        tree.add(&(20..35).collect::<Vec<u32>>());
        assert_eq!((tree.tokens(), tree.requests()), (10, 1));
        assert_eq!(draft(&tree, &[9, 5, 6]), Vec::<u32>::new());
        assert_eq!(draft(&tree, &[9, 25, 26]), [27, 28]);
        assert_eq!(draft(&tree, &[9, 23, 24]), Vec::<u32>::new(), "cut off");
        // A zero budget holds nothing.
        let mut none = GlobalTree::new(8, 0);
        none.add(&[1, 2, 3]);
        assert_eq!(
            (none.tokens(), none.requests(), none.trie().nodes()),
            (0, 0, 1)
        );
    }
}
