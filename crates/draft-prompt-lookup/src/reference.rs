//! A request's predicted output (OpenAI's predicted outputs, given as
//! [`spec_core::OpenContext::prediction`]): an n-gram index over it that is
//! followed in order. A lookup takes the context's longest suffix n-gram
//! that occurs in the prediction, at its first occurrence from the cursor
//! on (where the last accepted run of the prediction ended), else at its
//! last one; the draft is what follows there, up to the prediction's end.

use std::collections::HashMap;

use crate::index::Match;

/// The prediction and where it is being followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    min_ngram: usize,
    max_ngram: usize,
    tokens: Vec<u32>,
    /// n-gram -> positions of the tokens that follow its occurrences,
    /// ascending.
    followers: HashMap<Box<[u32]>, Vec<usize>>,
    /// Where following the prediction goes on: just past the prediction
    /// tokens the last reference draft had accepted.
    cursor: usize,
}

impl Reference {
    /// The index over `tokens` (n-grams of `min_ngram..=max_ngram`, the
    /// caller validated them).
    pub(crate) fn new(min_ngram: usize, max_ngram: usize, tokens: &[u32]) -> Self {
        let mut followers: HashMap<Box<[u32]>, Vec<usize>> = HashMap::new();
        for at in 1..tokens.len() {
            for n in min_ngram..=max_ngram.min(at) {
                followers
                    .entry(tokens[at - n..at].into())
                    .or_default()
                    .push(at);
            }
        }
        Self {
            min_ngram,
            max_ngram,
            tokens: tokens.to_vec(),
            followers,
            cursor: 0,
        }
    }

    /// The longest suffix n-gram of `context` found in the prediction, at
    /// its first occurrence from the cursor on, else its last.
    pub(crate) fn lookup(&self, context: &[u32]) -> Option<Match> {
        let len = context.len();
        (self.min_ngram..=self.max_ngram.min(len))
            .rev()
            .find_map(|n| {
                let positions = self.followers.get(&context[len - n..])?;
                let from = positions.partition_point(|&p| p < self.cursor);
                let start = positions.get(from).or(positions.last())?;
                Some(Match {
                    ngram: n,
                    start: *start,
                })
            })
    }

    /// Up to `limit` prediction tokens from `found` (none past its end).
    pub(crate) fn continuation(&self, found: Match, limit: usize) -> Vec<u32> {
        let end = found.start.saturating_add(limit).min(self.tokens.len());
        self.tokens
            .get(found.start..end)
            .map_or_else(Vec::new, <[u32]>::to_vec)
    }

    /// A draft from `start` had `accepted` tokens accepted: following goes
    /// on past them.
    pub(crate) fn advance(&mut self, start: usize, accepted: usize) {
        self.cursor = start + accepted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prediction_is_followed_in_order() {
        // "} ⏎" (7, 8) occurs twice; the first occurrence after the cursor
        // wins, so a prediction with repeated lines is read in order.
        let prediction = [1, 2, 7, 8, 3, 4, 7, 8, 5, 6];
        let mut r = Reference::new(1, 2, &prediction);
        let found = r.lookup(&[9, 7, 8]).expect("a match");
        assert_eq!(found, Match { ngram: 2, start: 4 });
        assert_eq!(r.continuation(found, 3), [3, 4, 7]);
        r.advance(4, 3);
        let found = r.lookup(&[9, 7, 8]).expect("a match");
        assert_eq!(found, Match { ngram: 2, start: 8 });
        assert_eq!(r.continuation(found, 5), [5, 6], "not past the end");
        // Past the last occurrence, the last one is taken.
        r.advance(8, 2);
        assert_eq!(r.lookup(&[7, 8]), Some(Match { ngram: 2, start: 8 }));
    }

    #[test]
    fn the_longest_suffix_wins_and_a_final_ngram_has_no_follower() {
        let r = Reference::new(1, 3, &[1, 2, 3, 4, 2, 3, 5]);
        assert_eq!(r.lookup(&[1, 2, 3]), Some(Match { ngram: 3, start: 3 }));
        assert_eq!(r.lookup(&[0, 2, 3]), Some(Match { ngram: 2, start: 3 }));
        assert_eq!(
            r.lookup(&[0, 0, 5]),
            None,
            "the last token is followed by nothing"
        );
        assert_eq!(r.lookup(&[]), None);
        assert_eq!(Reference::new(2, 3, &[]).lookup(&[1, 2]), None);
    }
}
