//! The per-request source: a local trie over the request's prompt and
//! committed tokens, drafting from it and from the provider's global tree,
//! and handing its tokens to the global tree when it completes.

use std::sync::Arc;

use mlx_rs::Array;
use parking_lot::RwLock;
use spec_core::{CommitInfo, Draft, DraftRequest, DraftSource, RequestOutcome, Sampler, SpecError};

use crate::global::GlobalTree;
use crate::trie::{Cursor, PathDraft, SuffixTrie};
use crate::SuffixConfig;

/// Where a source is in its `prefill`, then `draft` / `commit` cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    AwaitingPrefill,
    Ready,
    /// Drafted these tokens; waiting for their verification.
    AwaitingCommit(Vec<u32>),
}

/// Which tree a proposal came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The request's own prompt and output.
    Local,
    /// Earlier requests.
    Global,
}

/// Suffix decoding for one request.
///
/// **Sequence invariant** (as prompt lookup's): the source's tokens are the
/// prompt, then each commit's accepted tokens and `next`; in every `draft`
/// they are a prefix of `DraftRequest::history`, whose extra tokens (rounds
/// the loop ran without drafting) are appended first.
///
/// **Joining the global tree.** When the host calls
/// `finish(RequestOutcome::Completed)` (once, after the last commit), the
/// committed output (with the prompt when `prompt_in_global`) joins the
/// global tree, unless a call on the source failed or a draft still awaits
/// its commit. `Cancelled`, `Failed`, a source dropped without `finish` and
/// a second `finish` add nothing. Tokens emitted after the last `draft` in
/// rounds without a draft are not seen and do not join.
#[derive(Debug)]
pub struct SuffixSource {
    config: SuffixConfig,
    global: Arc<RwLock<GlobalTree>>,
    local: SuffixTrie,
    cursor: Cursor,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Leading tokens already compared with a history.
    checked: usize,
    phase: Phase,
    failed: bool,
    finished: bool,
    last_origin: Option<Origin>,
}

impl SuffixSource {
    /// A source drafting from its own tokens and from `global`.
    pub fn new(config: SuffixConfig, global: Arc<RwLock<GlobalTree>>) -> Self {
        Self {
            config,
            global,
            local: SuffixTrie::new(config.max_depth),
            cursor: Cursor::default(),
            tokens: Vec::new(),
            prompt_len: 0,
            checked: 0,
            phase: Phase::AwaitingPrefill,
            failed: false,
            finished: false,
            last_origin: None,
        }
    }

    /// Also drafts from `prediction`, the request's expected output
    /// (OpenAI's predicted outputs, `OpenContext::prediction`): it joins the
    /// request's own tree as a sequence of its own, never the global tree
    /// (which takes the request's tokens only).
    pub fn with_prediction(mut self, prediction: &[u32]) -> Self {
        if !prediction.is_empty() {
            self.local.insert(prediction);
        }
        self
    }

    /// The tokens seen: the prompt, then what commits and histories added.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Where the last non-empty proposal came from.
    pub fn last_origin(&self) -> Option<Origin> {
        self.last_origin
    }

    fn push(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.local.append(&mut self.cursor, t);
        }
        self.tokens.extend_from_slice(tokens);
    }

    fn check_history(&self, history: &[u32], feed: &[u32]) -> Result<(), SpecError> {
        spec_core::check_history(&self.tokens, self.checked, history, feed)
    }

    /// The proposal for the current tokens: the local tree's, unless the
    /// global tree's scores strictly higher (the cached requests it was
    /// matched in are then marked used).
    fn propose(&self, max_tokens: usize) -> (PathDraft, Origin) {
        let context = &self.tokens[self.tokens.len().saturating_sub(self.config.max_depth)..];
        let limits = self.config.limits(max_tokens);
        let local = self.local.speculate(context, limits);
        let global = self.global.read();
        let from_global = global.trie().speculate(context, limits);
        if from_global.score > local.score {
            if let Some(&first) = from_global.tokens.first() {
                let matched = &context[context.len() - from_global.match_len..];
                global.touch(&[matched, &[first]].concat());
            }
            (from_global, Origin::Global)
        } else {
            (local, Origin::Local)
        }
    }

    fn draft_checked(&mut self, request: &DraftRequest<'_>) -> Result<Vec<u32>, SpecError> {
        match &self.phase {
            Phase::Ready => {}
            Phase::AwaitingPrefill => {
                return Err(SpecError::Protocol("draft before prefill".to_owned()))
            }
            Phase::AwaitingCommit(drafted) => {
                return Err(SpecError::Protocol(format!(
                    "draft called again before the commit of the previous draft ({} tokens)",
                    drafted.len()
                )))
            }
        }
        self.check_history(request.history, request.feed)?;
        let seen = self.tokens.len();
        self.push(&request.history[seen..]);
        self.checked = request.history.len();
        let (draft, origin) = self.propose(request.max_tokens);
        if !draft.tokens.is_empty() {
            self.last_origin = Some(origin);
        }
        self.phase = Phase::AwaitingCommit(draft.tokens.clone());
        Ok(draft.tokens)
    }

    fn commit_checked(&mut self, info: &CommitInfo<'_>) -> Result<(), SpecError> {
        let Phase::AwaitingCommit(drafted) = &self.phase else {
            return Err(SpecError::Protocol(
                "commit without a preceding draft".to_owned(),
            ));
        };
        if info.drafted != drafted.len() || info.accepted > info.drafted {
            return Err(SpecError::Protocol(format!(
                "commit reports {} of {} drafted tokens accepted but the draft had {}",
                info.accepted,
                info.drafted,
                drafted.len()
            )));
        }
        if info.accepted_tokens != &drafted[..info.accepted] {
            return Err(SpecError::Protocol(format!(
                "commit's accepted tokens {:?} are not the draft's first {}",
                info.accepted_tokens, info.accepted
            )));
        }
        self.push(info.accepted_tokens);
        self.push(&[info.next]);
        self.phase = Phase::Ready;
        Ok(())
    }
}

impl DraftSource for SuffixSource {
    fn syncs_from_history(&self) -> bool {
        // `draft` reads whatever the history holds past the last commit.
        true
    }

    fn cheap_to_draft(&self) -> bool {
        // A draft is a walk down its suffix trees.
        true
    }

    fn prefill(&mut self, prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        if self.phase != Phase::AwaitingPrefill {
            self.failed = true;
            return Err(SpecError::Protocol(
                "prefill called twice on one source".to_owned(),
            ));
        }
        self.push(prompt);
        self.prompt_len = prompt.len();
        self.phase = Phase::Ready;
        Ok(())
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let tokens = self
            .draft_checked(&request)
            .inspect_err(|_| self.failed = true)?;
        Ok(Draft {
            tokens,
            probs: None,
        })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.commit_checked(&info)
            .inspect_err(|_| self.failed = true)
    }

    fn finish(&mut self, outcome: RequestOutcome) {
        let first = !std::mem::replace(&mut self.finished, true);
        let clean = !self.failed && self.phase == Phase::Ready;
        tracing::debug!(
            ?outcome,
            first,
            clean,
            tokens = self.tokens.len(),
            "suffix source finished"
        );
        if outcome != RequestOutcome::Completed
            || !first
            || !clean
            || self.tokens.len() == self.prompt_len
        {
            return;
        }
        let start = if self.config.prompt_in_global {
            0
        } else {
            self.prompt_len
        };
        self.global.write().add(&self.tokens[start..]);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use spec_core::driver::LoopDriver;
    use spec_core::GreedySampler;

    use super::*;
    use crate::SuffixProvider;

    /// Words to ids, in order of first appearance.
    fn tokenize(vocab: &mut BTreeMap<String, u32>, text: &str) -> Vec<u32> {
        text.split_whitespace()
            .map(|word| {
                let next = vocab.len() as u32;
                *vocab.entry(word.to_owned()).or_insert(next)
            })
            .collect()
    }

    /// The source driven as the serve loop drives it.
    type Driver = LoopDriver<SuffixSource>;

    fn start(provider: &SuffixProvider, prompt: &[u32]) -> Driver {
        LoopDriver::start(provider.source(), prompt).expect("prefill")
    }

    /// Greedy speculation against a target that emits `truth`: the tokens
    /// accepted and the rounds (target forwards) taken.
    fn run(d: &mut Driver, truth: &[u32], n: usize) -> (usize, usize) {
        let rounds = d.speculate(truth, n).expect("speculate");
        (rounds.iter().map(|(_, a)| a).sum(), rounds.len())
    }

    fn provider(config: SuffixConfig) -> SuffixProvider {
        SuffixProvider::new(config).expect("valid")
    }

    /// A prediction drafts where the prompt has nothing, stays lossless
    /// (the target's tokens are what is emitted) and never joins the
    /// global tree.
    #[test]
    fn a_prediction_drafts_in_the_request_alone() {
        let p = provider(SuffixConfig::default());
        let prompt = [1, 2, 3];
        let answer = [7, 8, 9, 10, 11, 12, 13, 14];
        let predicted = [7, 8, 9, 10, 5, 12, 13, 14];
        let plain = {
            let mut d = start(&p, &prompt);
            run(&mut d, &answer, 4)
        };
        assert_eq!(plain.0, 0, "nothing of the answer is in the prompt");
        let source = p.source().with_prediction(&predicted);
        let mut d = LoopDriver::start(source, &prompt).expect("prefill");
        let (accepted, rounds) = run(&mut d, &answer, 4);
        assert!(
            accepted >= 3 && rounds < plain.1,
            "with the prediction {accepted} accepted in {rounds} rounds, without {plain:?}"
        );
        let output = d.source.tokens()[prompt.len()..].to_vec();
        assert_eq!(output, answer[..output.len()], "the target's tokens");
        d.finish(RequestOutcome::Completed);
        let mut expected = SuffixTrie::new(SuffixConfig::default().max_depth);
        expected.insert(&output);
        // The first run never finished: only this one's output joined,
        // not its prediction.
        assert_eq!(
            *p.global().read().trie(),
            expected,
            "the output alone joins, never the prediction"
        );
    }

    #[test]
    fn only_committed_tokens_enter_either_tree() {
        let p = provider(SuffixConfig::default());
        let prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2];
        let mut d = start(&p, &prompt);
        let draft = d.draft(4).expect("draft");
        assert_eq!(draft, [3, 4, 1, 2], "the prompt repeats");
        // The target accepts one token and emits 9: `4 1 2` never enter.
        d.commit(&draft, 1, 9).expect("commit");
        let draft = d.draft(4).expect("draft");
        d.commit(&draft, 0, 7).expect("commit");
        let seen = [&prompt[..], &[3, 9, 7]].concat();
        assert_eq!(d.source.tokens(), seen);
        let mut expected = SuffixTrie::new(SuffixConfig::default().max_depth);
        expected.insert(&seen);
        assert_eq!(d.source.local, expected);
        assert_eq!(p.global().read().tokens(), 0, "nothing joins while running");
        d.finish(RequestOutcome::Completed);
        let global = p.global().read();
        assert_eq!((global.tokens(), global.requests()), (3, 1));
        let mut output = SuffixTrie::new(SuffixConfig::default().max_depth);
        output.insert(&[3, 9, 7]);
        assert_eq!(*global.trie(), output, "the output only, not the prompt");
    }

    #[test]
    fn the_prompt_joins_when_asked() {
        let p = provider(SuffixConfig {
            prompt_in_global: true,
            ..Default::default()
        });
        let mut d = start(&p, &[5, 6, 7]);
        let draft = d.draft(4).expect("draft");
        d.commit(&draft, 0, 8).expect("commit");
        d.finish(RequestOutcome::Completed);
        assert_eq!(p.global().read().tokens(), 4);
    }

    #[test]
    fn only_completed_requests_join_and_only_once() {
        let p = provider(SuffixConfig::default());
        let output = [7, 8, 9, 10];
        for outcome in [RequestOutcome::Cancelled, RequestOutcome::Failed] {
            let mut d = start(&p, &[1, 2, 3]);
            run(&mut d, &output, 4);
            d.finish(outcome);
        }
        // Dropped without being told how it ended.
        let mut d = start(&p, &[1, 2, 3]);
        run(&mut d, &output, 4);
        drop(d);
        assert_eq!(p.global().read().requests(), 0);
        let mut d = start(&p, &[1, 2, 3]);
        run(&mut d, &output, 4);
        d.source.finish(RequestOutcome::Completed);
        d.source.finish(RequestOutcome::Completed);
        assert_eq!(p.global().read().requests(), 1);
        assert_eq!(p.global().read().tokens(), output.len());
    }

    #[test]
    fn failed_and_empty_requests_add_nothing() {
        let p = provider(SuffixConfig::default());
        // Told it completed with a draft awaiting its commit: the round
        // failed.
        let mut d = start(&p, &[1, 2, 1, 2]);
        let draft = d.draft(2).expect("draft");
        d.commit(&draft, 2, 5).expect("commit");
        d.draft(2).expect("draft");
        d.finish(RequestOutcome::Completed);
        // A call the source refused.
        let mut d = start(&p, &[1, 2, 1, 2]);
        let draft = d.draft(2).expect("draft");
        let refused = d.source.commit(CommitInfo {
            drafted: 2,
            accepted: 3,
            accepted_tokens: &[1, 2, 1],
            foreign: &[],
            next: 5,
            verified_taps: None,
            verified_hidden: &Array::from_slice(&[0.0f32], &[1, 1, 1]),
        });
        assert!(matches!(refused, Err(SpecError::Protocol(m)) if m.contains("3 of 2")));
        d.commit(&draft, 0, 5).expect("a corrected commit is taken");
        d.finish(RequestOutcome::Completed);
        // No output at all.
        start(&p, &[1, 2, 3]).finish(RequestOutcome::Completed);
        // Never prefilled.
        p.source().finish(RequestOutcome::Completed);
        assert_eq!(p.global().read().requests(), 0);
    }

    #[test]
    fn protocol_misuse_is_refused() {
        let p = provider(SuffixConfig::default());
        let mut fresh = p.source();
        assert!(matches!(
            fresh.draft(
                DraftRequest {
                    feed: &[1],
                    max_tokens: 2,
                    anchor_hidden: None,
                    history: &[1],
                    target_caches: None
                },
                &mut GreedySampler
            ),
            Err(SpecError::Protocol(m)) if m.contains("before prefill")
        ));
        let mut d = start(&p, &[1, 2, 3, 1, 2]);
        assert!(
            matches!(d.commit(&[], 0, 1), Err(SpecError::Protocol(m)) if m.contains("without a preceding draft"))
        );
        d.history[1] = 7;
        assert!(matches!(d.draft(2), Err(SpecError::Protocol(m)) if m.contains("position 1")));
        d.history[1] = 2;
        let draft = d.draft(2).expect("still usable");
        assert_eq!(draft, [3, 1]);
        assert!(
            matches!(d.draft(2), Err(SpecError::Protocol(m)) if m.contains("before the commit"))
        );
        assert!(matches!(
            d.commit(&[3, 4], 2, 0),
            Err(SpecError::Protocol(m)) if m.contains("not the draft's first 2")
        ));
    }

    #[test]
    fn tokens_emitted_without_a_draft_are_taken_from_history() {
        let p = provider(SuffixConfig::default());
        let mut d = start(&p, &[1, 2, 3, 4]);
        let draft = d.draft(4).expect("draft");
        d.commit(&draft, 0, 9).expect("commit");
        // The controller paused: the loop emitted 1 and 2 without drafting.
        d.history.extend([1, 2]);
        d.feed = vec![2];
        assert_eq!(d.draft(2).expect("draft"), [3, 4]);
        assert_eq!(d.source.tokens(), [1, 2, 3, 4, 9, 1, 2]);
    }

    /// An agent loop's second turn: a different question, the same tool
    /// call shape. The global tree holds the first turn's output, so the
    /// second drafts far more of its answer.
    #[test]
    fn a_second_similar_request_drafts_more_than_the_first() {
        let mut vocab = BTreeMap::new();
        let turn = |vocab: &mut BTreeMap<String, u32>, city: &str, unit: &str| {
            let prompt = tokenize(
                vocab,
                &format!("user : what is the weather in {city} ? assistant :"),
            );
            let output = tokenize(
                vocab,
                &format!(
                    "{{ \" tool \" : \" get_weather \" , \" arguments \" : {{ \" city \" : \" {city} \" , \
                     \" unit \" : \" {unit} \" , \" days \" : 1 }} }} <end>"
                ),
            );
            (prompt, output)
        };
        let (prompt1, output1) = turn(&mut vocab, "Paris", "celsius");
        let (prompt2, output2) = turn(&mut vocab, "Oslo", "celsius");
        let p = provider(SuffixConfig::default());
        let mut first = start(&p, &prompt1);
        let (accepted1, rounds1) = run(&mut first, &output1, 16);
        first.finish(RequestOutcome::Completed);
        let mut second = start(&p, &prompt2);
        let (accepted2, rounds2) = run(&mut second, &output2, 16);
        assert_eq!(second.source.last_origin(), Some(Origin::Global));
        // Tokens per target forward: (accepted + rounds) / rounds.
        let per_forward = |a: usize, r: usize| (a + r) as f64 / r as f64;
        assert!(
            per_forward(accepted2, rounds2) >= 2.0 * per_forward(accepted1, rounds1),
            "first: {accepted1} accepted in {rounds1} rounds, second: {accepted2} in {rounds2}"
        );
        assert!(
            accepted2 * 10 >= output2.len() * 7,
            "{accepted2} of {}",
            output2.len()
        );
        second.finish(RequestOutcome::Completed);
        assert_eq!(p.global().read().requests(), 2);
    }

    #[test]
    fn sources_open_together_share_one_global_tree() {
        let p = provider(SuffixConfig::default());
        let mut a = start(&p, &[1, 2, 3]);
        let mut b = start(&p, &[4, 5, 6]);
        run(&mut a, &[10, 11, 12, 13], 4);
        run(&mut b, &[20, 21, 22], 4);
        a.finish(RequestOutcome::Completed);
        // `b` sees what `a` left as soon as it joined.
        b.history.extend([10, 11]);
        b.feed = vec![11];
        assert_eq!(b.draft(2).expect("draft"), [12, 13]);
        assert_eq!(b.source.last_origin(), Some(Origin::Global));
        assert_eq!(p.global().read().requests(), 1);
    }
}
