//! A draft source driven the way the serve loop drives one, without a
//! target: for providers' tests (ours and third parties'). The loop's
//! bookkeeping lives here once: the history ends with the pending token,
//! the feed is the pending token (and the last draft when a round accepted
//! every draft), and a commit names what was accepted and the next token.

use mlx_rs::Array;

use crate::{
    CommitInfo, Draft, DraftRequest, DraftSource, GreedySampler, RequestOutcome, SpecError,
};

/// A source after a tail-split prefill (the prompt's last token pending),
/// and the loop's state around it.
#[derive(Debug)]
pub struct LoopDriver<S> {
    /// The source driven.
    pub source: S,
    /// Every token so far, the pending one last.
    pub history: Vec<u32>,
    /// What the next draft is fed.
    pub feed: Vec<u32>,
    hidden: Array,
}

impl<S: DraftSource> LoopDriver<S> {
    /// `source` prefilled with `prompt` (no taps).
    pub fn start(mut source: S, prompt: &[u32]) -> Result<Self, SpecError> {
        source.prefill(prompt, None)?;
        Ok(Self {
            source,
            history: prompt.to_vec(),
            feed: prompt.last().map(|&t| vec![t]).unwrap_or_default(),
            hidden: Array::from_slice(&[0.0f32], &[1, 1, 1]),
        })
    }

    /// A greedy draft of at most `max_tokens`: its tokens.
    pub fn draft(&mut self, max_tokens: usize) -> Result<Vec<u32>, SpecError> {
        Ok(self.propose(max_tokens)?.tokens)
    }

    /// A greedy draft of at most `max_tokens`, whole.
    pub fn propose(&mut self, max_tokens: usize) -> Result<Draft, SpecError> {
        let request = DraftRequest {
            feed: &self.feed,
            max_tokens,
            anchor_hidden: None,
            history: &self.history,
            target_caches: None,
        };
        self.source.draft(request, &mut GreedySampler)
    }

    /// The target kept `accepted` of `drafted` and emitted `next`.
    pub fn commit(&mut self, drafted: &[u32], accepted: usize, next: u32) -> Result<(), SpecError> {
        self.source.commit(CommitInfo {
            drafted: drafted.len(),
            accepted,
            accepted_tokens: &drafted[..accepted],
            foreign: &[],
            next,
            verified_taps: None,
            verified_hidden: &self.hidden,
        })?;
        self.history.extend_from_slice(&drafted[..accepted]);
        self.history.push(next);
        self.feed = match drafted.last() {
            Some(&last) if accepted == drafted.len() => vec![last, next],
            _ => vec![next],
        };
        Ok(())
    }

    /// The request ended so: the source is told, once.
    pub fn finish(mut self, outcome: RequestOutcome) {
        self.source.finish(outcome);
    }

    /// A round the loop ran without drafting (its controller paused).
    pub fn skip(&mut self, next: u32) {
        self.history.push(next);
        self.feed = vec![next];
    }

    /// Greedy speculation against a target that emits `truth`, drafts of
    /// at most `n`: each round's draft and how many of it were accepted.
    pub fn speculate(
        &mut self,
        truth: &[u32],
        n: usize,
    ) -> Result<Vec<(Vec<u32>, usize)>, SpecError> {
        let mut rounds = Vec::new();
        let mut emitted = 0;
        while emitted < truth.len() {
            let draft = self.draft(n.min(truth.len() - emitted))?;
            let accepted = draft
                .iter()
                .zip(&truth[emitted..])
                .take_while(|(d, t)| d == t)
                .count();
            let next = truth[(emitted + accepted).min(truth.len() - 1)];
            self.commit(&draft, accepted, next)?;
            emitted += accepted + 1;
            rounds.push((draft, accepted));
        }
        Ok(rounds)
    }
}
