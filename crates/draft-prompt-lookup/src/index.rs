//! The n-gram index over a growing token sequence: for every n-gram of the
//! configured sizes that has been followed by a token, where its most
//! recent follower sits.

use std::collections::HashMap;

/// A match of the sequence's suffix against an earlier occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Match {
    /// Length of the matched suffix n-gram.
    pub(crate) ngram: usize,
    /// Position of the token that followed the earlier occurrence: the
    /// draft is `tokens[start..]`, cut to the draft length.
    pub(crate) start: usize,
}

/// A token sequence that only grows, indexed by its n-grams.
///
/// An n-gram is indexed once a token follows it, keyed to that follower's
/// position, so the sequence's own suffix is never its own match and every
/// match has a non-empty continuation. A later occurrence overwrites the
/// position: the most recent one wins. Appending a token touches one key
/// per n-gram size; a lookup hashes at most one key per size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NgramIndex {
    min_ngram: usize,
    max_ngram: usize,
    tokens: Vec<u32>,
    /// n-gram (between `min_ngram` and `max_ngram` tokens; lengths keep the
    /// sizes apart) -> position of the token after its latest occurrence.
    follower: HashMap<Box<[u32]>, usize>,
}

impl NgramIndex {
    /// An empty index over n-grams of `min_ngram..=max_ngram` tokens; the
    /// caller validated `1 <= min_ngram <= max_ngram`.
    pub(crate) fn new(min_ngram: usize, max_ngram: usize) -> Self {
        Self {
            min_ngram,
            max_ngram,
            tokens: Vec::new(),
            follower: HashMap::new(),
        }
    }

    /// The sequence so far.
    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends one token, indexing the n-grams it follows.
    pub(crate) fn push(&mut self, token: u32) {
        let at = self.tokens.len();
        for n in self.min_ngram..=self.max_ngram.min(at) {
            let gram = &self.tokens[at - n..at];
            match self.follower.get_mut(gram) {
                Some(position) => *position = at,
                None => {
                    self.follower.insert(gram.into(), at);
                }
            }
        }
        self.tokens.push(token);
    }

    /// Appends `tokens` in order.
    pub(crate) fn extend(&mut self, tokens: &[u32]) {
        for &token in tokens {
            self.push(token);
        }
    }

    /// The longest suffix n-gram (from `max_ngram` down to `min_ngram`)
    /// that occurred earlier, at its most recent earlier occurrence.
    pub(crate) fn lookup(&self) -> Option<Match> {
        let len = self.tokens.len();
        (self.min_ngram..=self.max_ngram.min(len))
            .rev()
            .find_map(|n| {
                self.follower
                    .get(&self.tokens[len - n..])
                    .map(|&start| Match { ngram: n, start })
            })
    }

    /// `limit` tokens predicted from `found`: the tokens that followed the
    /// earlier occurrence, and past the end of the sequence the same run
    /// again. Reaching the end means the suffix repeats the span
    /// `tokens[found.start..]`: once that span is appended the suffix matches
    /// at the span's end, and the index would propose the span again, so
    /// the draft repeats it with that period (a loop keeps being drafted at
    /// full length instead of one period per round).
    pub(crate) fn continuation(&self, found: Match, limit: usize) -> Vec<u32> {
        let span = self.tokens.get(found.start..).unwrap_or(&[]);
        if span.is_empty() {
            return Vec::new();
        }
        span.iter().copied().cycle().take(limit).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(min: usize, max: usize, tokens: &[u32]) -> NgramIndex {
        let mut index = NgramIndex::new(min, max);
        index.extend(tokens);
        index
    }

    #[test]
    fn longest_match_wins_over_a_more_recent_shorter_one() {
        // Suffix [7, 8, 9]: the trigram occurred at 0..3 (followed by 1);
        // the bigram [8, 9] also occurred later, at 5..7 (followed by 2).
        let tokens = [7, 8, 9, 1, 0, 8, 9, 2, 0, 7, 8, 9];
        let idx = index(1, 4, &tokens);
        let found = idx.lookup().expect("a match");
        assert_eq!(found, Match { ngram: 3, start: 3 });
        assert_eq!(idx.continuation(found, 3), [1, 0, 8]);
        // Limited to bigrams, the more recent bigram occurrence wins.
        let idx = index(1, 2, &tokens);
        assert_eq!(idx.lookup(), Some(Match { ngram: 2, start: 7 }));
        assert_eq!(
            idx.continuation(Match { ngram: 2, start: 7 }, 5),
            [2, 0, 7, 8, 9]
        );
    }

    #[test]
    fn most_recent_of_equal_length_matches_wins() {
        // [4, 5] occurs at 0, 3 and 6 before the suffix; 6 is the latest.
        let tokens = [4, 5, 10, 4, 5, 11, 4, 5, 12, 4, 5];
        let idx = index(2, 2, &tokens);
        let found = idx.lookup().expect("a match");
        assert_eq!(found, Match { ngram: 2, start: 8 });
        assert_eq!(idx.continuation(found, 1), [12]);
    }

    #[test]
    fn the_suffix_is_not_its_own_match() {
        let idx = index(1, 4, &[1, 2, 3, 4]);
        assert_eq!(idx.lookup(), None);
        // A run: the latest earlier [5, 5] ends one before the suffix; the
        // run is drafted on at full length.
        let idx = index(2, 2, &[5, 5, 5]);
        let found = idx.lookup().expect("a match");
        assert_eq!(found, Match { ngram: 2, start: 2 });
        assert_eq!(idx.continuation(found, 4), [5, 5, 5, 5]);
    }

    #[test]
    fn continuation_past_the_end_repeats_the_matched_span() {
        let idx = index(2, 3, &[1, 2, 3, 1, 2]);
        let found = idx.lookup().expect("a match");
        assert_eq!(found, Match { ngram: 2, start: 2 });
        assert_eq!(idx.continuation(found, 2), [3, 1]);
        assert_eq!(idx.continuation(found, 8), [3, 1, 2, 3, 1, 2, 3, 1]);
        assert_eq!(idx.continuation(found, 0), Vec::<u32>::new());
    }

    #[test]
    fn a_repeated_continuation_is_what_the_index_proposes_after_accepting_it() {
        // Drafting 3 tokens at once equals drafting one at a time and
        // appending each: the cycle is the index's own prediction.
        let mut idx = index(2, 4, &[9, 4, 5, 6, 4, 5]);
        let found = idx.lookup().expect("a match");
        let at_once = idx.continuation(found, 5);
        let mut one_by_one = Vec::new();
        for _ in 0..5 {
            let step = idx.lookup().expect("a match");
            let next = idx.continuation(step, 1)[0];
            one_by_one.push(next);
            idx.push(next);
        }
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once, [6, 4, 5, 6, 4]);
    }

    #[test]
    fn sequences_shorter_than_min_ngram_never_match() {
        assert_eq!(index(2, 4, &[]).lookup(), None);
        assert_eq!(index(2, 4, &[3]).lookup(), None);
        assert_eq!(index(3, 4, &[3, 3]).lookup(), None);
        assert_eq!(
            index(2, 4, &[3, 3, 3]).lookup(),
            Some(Match { ngram: 2, start: 2 })
        );
    }
}
