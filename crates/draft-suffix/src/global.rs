//! The global tree: a suffix trie over finished requests' committed
//! tokens, bounded by a token budget and evicting whole requests, least
//! recently used first.
//!
//! "Used": a request is used when it joins and whenever a draft proposed
//! from the global trie continues a match found in it (the matched suffix
//! and the first proposed token occur in its tokens). Several requests may
//! hold the same n-gram: each of them counts as used. Drafting takes the
//! read lock only: use times are atomics.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::trie::SuffixTrie;

/// One cached request.
#[derive(Debug)]
struct Cached {
    tokens: Vec<u32>,
    /// The tick of its last use (its joining counts).
    last_used: AtomicU64,
}

/// Finished requests' tokens and their trie.
#[derive(Debug)]
pub struct GlobalTree {
    trie: SuffixTrie,
    /// Cached requests, in the order they joined.
    requests: Vec<Cached>,
    /// Tokens held by `requests`.
    tokens: usize,
    budget: usize,
    /// The last tick handed out (joins and uses).
    clock: AtomicU64,
}

impl GlobalTree {
    /// An empty tree holding at most `budget` tokens (0: it holds none).
    pub fn new(max_depth: usize, budget: usize) -> Self {
        Self {
            trie: SuffixTrie::new(max_depth),
            requests: Vec::new(),
            tokens: 0,
            budget,
            clock: AtomicU64::new(0),
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

    /// The cached requests' tokens, in the order they joined.
    pub fn cached(&self) -> impl Iterator<Item = &[u32]> {
        self.requests.iter().map(|r| r.tokens.as_slice())
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Adds one finished request's tokens, evicting the least recently
    /// used requests (the earliest joined among equals) while the budget
    /// would be exceeded; a request longer than the budget keeps its last
    /// `budget` tokens.
    pub fn add(&mut self, tokens: &[u32]) {
        let kept = &tokens[tokens.len().saturating_sub(self.budget)..];
        if kept.is_empty() {
            return;
        }
        while self.tokens + kept.len() > self.budget {
            let Some(lru) = self
                .requests
                .iter()
                .enumerate()
                .min_by_key(|(i, r)| (r.last_used.load(Ordering::Relaxed), *i))
                .map(|(i, _)| i)
            else {
                break;
            };
            let evicted = self.requests.remove(lru);
            self.trie.remove(&evicted.tokens);
            self.tokens -= evicted.tokens.len();
        }
        self.trie.insert(kept);
        self.tokens += kept.len();
        let joined = self.tick();
        self.requests.push(Cached {
            tokens: kept.to_vec(),
            last_used: AtomicU64::new(joined),
        });
        tracing::debug!(
            added = kept.len(),
            tokens = self.tokens,
            requests = self.requests.len(),
            nodes = self.trie.nodes(),
            "suffix global tree updated"
        );
    }

    /// Marks as used every cached request whose tokens contain `ngram`
    /// (a matched suffix and the token proposed after it); returns how many.
    pub fn touch(&self, ngram: &[u32]) -> usize {
        if ngram.is_empty() {
            return 0;
        }
        let now = self.tick();
        let mut touched = 0;
        for request in &self.requests {
            if request.tokens.windows(ngram.len()).any(|w| w == ngram) {
                request.last_used.store(now, Ordering::Relaxed);
                touched += 1;
            }
        }
        touched
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
    fn whole_requests_are_evicted_under_the_budget() {
        let mut tree = GlobalTree::new(8, 10);
        tree.add(&[1, 2, 3, 4]);
        tree.add(&[5, 6, 7, 8]);
        assert_eq!((tree.tokens(), tree.requests()), (8, 2));
        assert_eq!(draft(&tree, &[9, 1, 2]), [3, 4]);
        // 8 + 3 > 10: the least recently used (the first: neither was
        // drafted from) goes, whole.
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

    #[test]
    fn a_request_drafted_from_outlives_older_unused_ones() {
        let mut tree = GlobalTree::new(8, 12);
        tree.add(&[1, 2, 3, 4]);
        tree.add(&[5, 6, 7, 8]);
        tree.add(&[9, 10, 11, 12]);
        // A draft matched `1 2` and proposed 3: the first request is used.
        assert_eq!(tree.touch(&[1, 2, 3]), 1);
        assert_eq!(tree.touch(&[2, 9]), 0, "no request holds it");
        tree.add(&[13, 14, 15, 16]);
        let left: Vec<&[u32]> = tree.cached().collect();
        assert_eq!(
            left,
            [&[1, 2, 3, 4][..], &[9, 10, 11, 12], &[13, 14, 15, 16]],
            "the second, never used, went first"
        );
        assert_eq!(draft(&tree, &[0, 1, 2]), [3, 4]);
        assert_eq!(draft(&tree, &[0, 5, 6]), Vec::<u32>::new());
        // Every request holding the n-gram is used.
        tree.add(&[3, 4, 1, 2]);
        assert_eq!(tree.touch(&[1, 2]), 2);
        tree.add(&[20, 21, 22, 23]);
        let left: Vec<&[u32]> = tree.cached().collect();
        assert_eq!(left, [&[1, 2, 3, 4][..], &[3, 4, 1, 2], &[20, 21, 22, 23]]);
        assert_eq!(tree.tokens(), 12);
        assert_eq!(tree.trie().tokens(), 12);
    }
}
