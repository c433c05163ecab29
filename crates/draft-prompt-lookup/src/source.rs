//! The per-request source: keeps its own copy of the request's tokens in an
//! n-gram index, checks it against the serve loop's history every round,
//! and drafts the continuation of the suffix's latest earlier occurrence.

use mlx_rs::Array;
use spec_core::{CommitInfo, Draft, DraftRequest, DraftSource, Sampler, SpecError};

use crate::index::NgramIndex;
use crate::reference::Reference;
use crate::PromptLookupConfig;

/// Where a source is in its `prefill`, then `draft` / `commit` cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Nothing seen yet.
    AwaitingPrefill,
    /// Ready to draft.
    Ready,
    /// Drafted these tokens; waiting for their verification.
    AwaitingCommit(Vec<u32>),
}

/// Prompt lookup for one request.
///
/// **Sequence invariant.** The source's sequence is the prompt given to
/// `prefill`, then for each `commit` its `accepted_tokens` and `next`. In
/// every `draft` it must be a prefix of `DraftRequest::history` (which ends
/// with the pending token, so when the loop commits every round the two
/// are equal), and `history` must end with `feed`. Tokens of `history`
/// past the sequence are ones the loop emitted in rounds it drafted
/// nothing (its controller paused drafting) and are appended before
/// drafting. Each history token is compared once, when it first becomes
/// part of the sequence's checked prefix: the serve loop only appends to
/// `history`, so a round costs O(new tokens), not O(context).
///
/// **Errors.** `SpecError::Protocol` for: `draft` or `commit` before
/// `prefill`, a second `prefill`, `draft` twice without `commit`, `commit`
/// without a preceding `draft`, a `drafted` count other than the draft's
/// length, `accepted > drafted`, `accepted_tokens.len() != accepted`,
/// accepted tokens other than the draft's prefix, and a history the
/// sequence is not a prefix of. A rejected call changes nothing, so the
/// source stays usable: the call can be retried with correct arguments.
#[derive(Debug, Clone)]
pub struct PromptLookupSource {
    config: PromptLookupConfig,
    index: NgramIndex,
    phase: Phase,
    /// Leading tokens of the sequence already compared with `history`.
    checked: usize,
    /// The request's predicted output, when it has one.
    prediction: Option<Reference>,
    /// Where in the prediction the pending draft started, when it came
    /// from there.
    from_prediction: Option<usize>,
}

impl PromptLookupSource {
    /// A source with `config`, which must be valid.
    pub fn new(config: PromptLookupConfig) -> Result<Self, SpecError> {
        config.validate()?;
        Ok(Self {
            config,
            index: NgramIndex::new(config.min_ngram, config.max_ngram),
            phase: Phase::AwaitingPrefill,
            checked: 0,
            prediction: None,
            from_prediction: None,
        })
    }

    /// A source that also drafts from `prediction`, the request's expected
    /// output (OpenAI's predicted outputs), followed in order: each round
    /// the context's longest suffix n-gram is looked up in the request's
    /// own tokens and in the prediction, and the prediction's match is
    /// taken unless the request's own is longer. Empty: none.
    pub fn with_prediction(
        config: PromptLookupConfig,
        prediction: &[u32],
    ) -> Result<Self, SpecError> {
        let mut source = Self::new(config)?;
        if !prediction.is_empty() {
            source.prediction = Some(Reference::new(
                config.min_ngram,
                config.max_ngram,
                prediction,
            ));
        }
        Ok(source)
    }

    /// The source's settings.
    pub fn config(&self) -> &PromptLookupConfig {
        &self.config
    }

    /// The tokens the source has seen: the prompt, then what commits and
    /// histories added.
    pub fn tokens(&self) -> &[u32] {
        self.index.tokens()
    }

    /// Checks `history` and `feed` against the sequence (see the type's
    /// invariant) without changing anything.
    fn check_history(&self, history: &[u32], feed: &[u32]) -> Result<(), SpecError> {
        spec_core::check_history(self.index.tokens(), self.checked, history, feed)
    }
}

impl DraftSource for PromptLookupSource {
    fn syncs_from_history(&self) -> bool {
        // `draft` reads whatever the history holds past the last commit.
        true
    }

    fn cheap_to_draft(&self) -> bool {
        // A draft is a lookup in an n-gram index.
        true
    }

    fn prefill(&mut self, prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        if self.phase != Phase::AwaitingPrefill {
            return Err(SpecError::Protocol(
                "prefill called twice on one source".to_owned(),
            ));
        }
        self.index.extend(prompt);
        self.phase = Phase::Ready;
        Ok(())
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
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
        let seen = self.index.tokens().len();
        self.index.extend(&request.history[seen..]);
        self.checked = request.history.len();

        let limit = self
            .config
            .num_draft
            .map_or(request.max_tokens, |cap| cap.min(request.max_tokens));
        let own = self.index.lookup();
        let predicted = self.prediction.as_ref().and_then(|p| {
            let found = p.lookup(self.index.tokens())?;
            let longer_own = own.is_some_and(|o| o.ngram > found.ngram);
            (!longer_own).then(|| (found.start, p.continuation(found, limit)))
        });
        self.from_prediction = None;
        let tokens = match (predicted, own) {
            _ if limit == 0 => Vec::new(),
            (Some((start, tokens)), _) if !tokens.is_empty() => {
                self.from_prediction = Some(start);
                tokens
            }
            (_, Some(found)) => self.index.continuation(found, limit),
            _ => Vec::new(),
        };
        self.phase = Phase::AwaitingCommit(tokens.clone());
        Ok(Draft {
            tokens,
            probs: None,
        })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let drafted = match &self.phase {
            Phase::AwaitingCommit(drafted) => drafted,
            Phase::AwaitingPrefill | Phase::Ready => {
                return Err(SpecError::Protocol(
                    "commit without a preceding draft".to_owned(),
                ))
            }
        };
        if info.accepted > info.drafted {
            return Err(SpecError::Protocol(format!(
                "commit accepted {} of {} drafted tokens",
                info.accepted, info.drafted
            )));
        }
        if info.drafted != drafted.len() {
            return Err(SpecError::Protocol(format!(
                "commit reports {} drafted tokens but the draft had {}",
                info.drafted,
                drafted.len()
            )));
        }
        if info.accepted_tokens.len() != info.accepted {
            return Err(SpecError::Protocol(format!(
                "commit accepted {} tokens but lists {}",
                info.accepted,
                info.accepted_tokens.len()
            )));
        }
        if let Some(at) = info
            .accepted_tokens
            .iter()
            .zip(drafted)
            .position(|(a, d)| a != d)
        {
            return Err(SpecError::Protocol(format!(
                "accepted token {at} is {} but the draft proposed {}",
                info.accepted_tokens[at], drafted[at]
            )));
        }
        if let (Some(start), Some(p)) = (self.from_prediction.take(), self.prediction.as_mut()) {
            p.advance(start, info.accepted);
        }
        self.index.extend(info.accepted_tokens);
        self.index.push(info.next);
        self.phase = Phase::Ready;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use spec_core::driver::LoopDriver;
    use spec_core::GreedySampler;

    use super::*;

    /// The source driven as the serve loop drives it.
    type Driver = LoopDriver<PromptLookupSource>;

    fn start(config: PromptLookupConfig, prompt: &[u32]) -> Driver {
        let source = PromptLookupSource::new(config).expect("valid config");
        LoopDriver::start(source, prompt).expect("prefill")
    }

    /// Words to ids, in order of first appearance.
    fn tokenize(vocab: &mut HashMap<String, u32>, text: &str) -> Vec<u32> {
        text.split_whitespace()
            .map(|word| {
                let next = vocab.len() as u32;
                *vocab.entry(word.to_owned()).or_insert(next)
            })
            .collect()
    }

    /// Greedy speculation against a target that emits `truth`: returns each
    /// round's draft and how many of it were accepted.
    fn speculate(
        config: PromptLookupConfig,
        prompt: &[u32],
        truth: &[u32],
        n: usize,
    ) -> Vec<(Vec<u32>, usize)> {
        let mut driver = start(config, prompt);
        let draft = driver.propose(n).expect("draft");
        assert!(
            draft.probs.is_none(),
            "prompt lookup proposes deterministically"
        );
        let mut driver = start(config, prompt);
        let rounds = driver.speculate(truth, n).expect("speculate");
        assert_eq!(
            &driver.history[prompt.len()..prompt.len() + truth.len()],
            truth
        );
        rounds
    }

    #[test]
    fn code_edit_proposes_the_rest_of_the_snippet() {
        let mut vocab = HashMap::new();
        // `⏎` stands for the newline token.
        let prompt = tokenize(
            &mut vocab,
            "Rename total to sum in this function : ⏎ \
             fn add ( a : i32 , b : i32 ) -> i32 { ⏎ let total = a + b ; ⏎ total ⏎ } ⏎ \
             Answer with the code only . ⏎",
        );
        let truth = tokenize(
            &mut vocab,
            "fn add ( a : i32 , b : i32 ) -> i32 { ⏎ let sum = a + b ; ⏎ sum ⏎ } ⏎",
        );
        let rounds = speculate(PromptLookupConfig::default(), &prompt, &truth, 8);

        // The prompt ends "only . ⏎": that bigram does not recur, so the
        // first round steps plainly and emits `fn`; then `⏎ fn` recurs
        // (the snippet's first line) and the signature is proposed.
        assert_eq!(rounds[0], (vec![], 0));
        let words = |ids: &[u32]| -> Vec<String> {
            ids.iter()
                .map(|id| {
                    vocab
                        .iter()
                        .find(|(_, v)| *v == id)
                        .map(|(w, _)| w.clone())
                        .expect("known")
                })
                .collect()
        };
        assert_eq!(
            words(&rounds[1].0),
            ["add", "(", "a", ":", "i32", ",", "b", ":"]
        );
        assert_eq!(rounds[1].1, 8);
        // The rename is where the copy breaks: a proposal with `total` is
        // rejected at that token.
        let renamed = vocab["total"];
        assert!(rounds
            .iter()
            .any(|(draft, accepted)| draft.get(*accepted) == Some(&renamed)));
        let accepted: usize = rounds.iter().map(|(_, a)| a).sum();
        assert!(
            rounds.len() * 2 <= truth.len(),
            "{} rounds for {} tokens",
            rounds.len(),
            truth.len()
        );
        assert!(
            accepted * 3 >= truth.len() * 2,
            "accepted {accepted} of {}",
            truth.len()
        );
    }

    /// A predicted output the prompt does not hold (OpenAI's predicted
    /// outputs): drafts follow it, break off where the answer leaves it
    /// (`on` for `off`) and pick it up again; the answer is the target's
    /// either way.
    #[test]
    fn a_prediction_is_drafted_in_order_where_the_prompt_has_nothing() {
        let mut vocab = HashMap::new();
        let prompt = tokenize(&mut vocab, "Write the config with debug on . ⏎");
        let predicted = tokenize(
            &mut vocab,
            "[ server ] ⏎ port = 80 ⏎ debug = off ⏎ [ client ] ⏎ port = 81 ⏎ retries = 3 ⏎",
        );
        let truth = tokenize(
            &mut vocab,
            "[ server ] ⏎ port = 80 ⏎ debug = on ⏎ [ client ] ⏎ port = 81 ⏎ retries = 3 ⏎",
        );
        let config = PromptLookupConfig::default();
        let source = PromptLookupSource::with_prediction(config, &predicted).expect("valid");
        let mut driver = LoopDriver::start(source, &prompt).expect("prefill");
        let rounds = driver.speculate(&truth, 8).expect("speculate");
        assert_eq!(
            &driver.history[prompt.len()..prompt.len() + truth.len()],
            &truth[..]
        );
        let accepted: usize = rounds.iter().map(|(_, a)| a).sum();
        // Without the prediction nothing of the answer is in the prompt.
        let plain = speculate(config, &prompt, &truth, 8);
        let plain_accepted: usize = plain.iter().map(|(_, a)| a).sum();
        assert!(
            accepted >= truth.len() - 6 && accepted > plain_accepted + 10,
            "accepted {accepted} (without the prediction {plain_accepted}) of {}: {rounds:?}",
            truth.len()
        );
        // The client's section (its `port = 81`) is drafted once the answer
        // reaches it, after the server's.
        let client = vocab["client"];
        assert!(
            rounds.iter().any(|(d, a)| *a > 0 && d[0] == client),
            "{rounds:?}"
        );
    }

    #[test]
    fn empty_draft_when_nothing_matches() {
        let mut driver = start(PromptLookupConfig::default(), &[1, 2, 3, 4, 5]);
        assert_eq!(driver.draft(4).expect("draft"), Vec::<u32>::new());
        driver
            .commit(&[], 0, 6)
            .expect("an empty draft is committed like any other");
        assert_eq!(driver.draft(4).expect("draft"), Vec::<u32>::new());
        // A lone repeated token is below the default min_ngram of 2.
        driver.commit(&[], 0, 1).expect("commit");
        assert_eq!(driver.draft(4).expect("draft"), Vec::<u32>::new());
        // With unigrams allowed it matches.
        let mut unigrams = start(
            PromptLookupConfig {
                min_ngram: 1,
                ..Default::default()
            },
            &[1, 2, 3, 1],
        );
        assert_eq!(unigrams.draft(4).expect("draft"), [2, 3, 1, 2]);
    }

    #[test]
    fn draft_length_is_capped_by_max_tokens_and_num_draft() {
        let prompt = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        let mut driver = start(
            PromptLookupConfig {
                min_ngram: 1,
                ..Default::default()
            },
            &prompt,
        );
        assert_eq!(driver.draft(3).expect("draft"), [1, 2, 3]);
        let mut capped = start(
            PromptLookupConfig {
                min_ngram: 1,
                num_draft: Some(2),
                ..Default::default()
            },
            &prompt,
        );
        assert_eq!(capped.draft(3).expect("draft"), [1, 2]);
        let mut zero = start(
            PromptLookupConfig {
                min_ngram: 1,
                ..Default::default()
            },
            &prompt,
        );
        assert_eq!(zero.draft(0).expect("draft"), Vec::<u32>::new());
    }

    #[test]
    fn tokens_emitted_in_rounds_without_a_draft_are_taken_from_history() {
        let mut driver = start(PromptLookupConfig::default(), &[1, 2, 3, 4, 5]);
        driver.draft(4).expect("draft");
        driver.commit(&[], 0, 7).expect("commit");
        // The controller paused: two rounds ran without the source.
        driver.skip(1);
        driver.skip(2);
        assert_eq!(driver.draft(4).expect("draft"), [3, 4, 5, 7]);
        assert_eq!(driver.source.tokens(), [1, 2, 3, 4, 5, 7, 1, 2]);
    }

    /// Every protocol misuse is rejected and leaves the source as it was.
    #[test]
    fn protocol_misuse_is_an_error_and_changes_nothing() {
        fn check(
            what: &str,
            source: &mut PromptLookupSource,
            misuse: impl FnOnce(&mut PromptLookupSource) -> Result<(), SpecError>,
            fragment: &str,
        ) {
            let before = source.clone();
            match misuse(source) {
                Err(SpecError::Protocol(message)) => assert!(
                    message.contains(fragment),
                    "{what}: `{message}` lacks `{fragment}`"
                ),
                other => panic!("{what}: expected a protocol error, got {other:?}"),
            }
            assert_eq!(
                (&source.index, &source.phase, source.checked),
                (&before.index, &before.phase, before.checked),
                "{what}"
            );
        }
        let hidden = Array::from_slice(&[0.0f32], &[1, 1, 1]);
        let commit =
            |drafted: usize, accepted: usize, tokens: &[u32], source: &mut PromptLookupSource| {
                source.commit(CommitInfo {
                    drafted,
                    accepted,
                    accepted_tokens: tokens,
                    foreign: &[],
                    next: 0,
                    verified_taps: None,
                    verified_hidden: &hidden,
                })
            };
        let draft = |history: &[u32], feed: &[u32], source: &mut PromptLookupSource| {
            let request = DraftRequest {
                feed,
                max_tokens: 4,
                anchor_hidden: None,
                history,
                target_caches: None,
            };
            source.draft(request, &mut GreedySampler).map(|_| ())
        };
        let prompt = [1, 2, 3, 4, 1, 2];

        let mut fresh = PromptLookupSource::new(PromptLookupConfig::default()).expect("valid");
        check(
            "draft before prefill",
            &mut fresh,
            |s| draft(&prompt, &[2], s),
            "before prefill",
        );
        check(
            "commit before prefill",
            &mut fresh,
            |s| commit(0, 0, &[], s),
            "without a preceding draft",
        );

        let mut driver = start(PromptLookupConfig::default(), &prompt);
        let s = &mut driver.source;
        check(
            "prefill twice",
            s,
            |s| s.prefill(&prompt, None),
            "prefill called twice",
        );
        check(
            "commit without draft",
            s,
            |s| commit(0, 0, &[], s),
            "without a preceding draft",
        );
        check(
            "history shorter than the prompt",
            s,
            |s| draft(&prompt[..5], &[1], s),
            "history has 5 tokens",
        );
        check(
            "history differs from the prompt",
            s,
            |s| draft(&[1, 2, 9, 4, 1, 2], &[2], s),
            "at position 2: token 9 in history, 3 seen",
        );
        check(
            "history without the feed at its end",
            s,
            |s| draft(&prompt, &[7], s),
            "does not end with the feed",
        );

        assert_eq!(
            driver.draft(4).expect("the source is still usable"),
            [3, 4, 1, 2]
        );
        let s = &mut driver.source;
        check(
            "draft twice",
            s,
            |s| draft(&prompt, &[2], s),
            "before the commit of the previous draft (4 tokens)",
        );
        check(
            "accepted more than drafted",
            s,
            |s| commit(4, 5, &[3, 4, 1, 2, 0], s),
            "accepted 5 of 4",
        );
        check(
            "wrong drafted count",
            s,
            |s| commit(3, 3, &[3, 4, 1], s),
            "reports 3 drafted tokens but the draft had 4",
        );
        check(
            "accepted count and tokens disagree",
            s,
            |s| commit(4, 2, &[3], s),
            "accepted 2 tokens but lists 1",
        );
        check(
            "accepted tokens differ from the draft",
            s,
            |s| commit(4, 2, &[3, 5], s),
            "accepted token 1 is 5 but the draft proposed 4",
        );

        driver
            .commit(&[3, 4, 1, 2], 2, 8)
            .expect("the source is still usable");
        let s = &mut driver.source;
        check(
            "commit twice",
            s,
            |s| commit(4, 2, &[3, 4], s),
            "without a preceding draft",
        );
        let mut history = driver.history.clone();
        history[6] = 5; // contradicts the committed accepted tokens
        check(
            "history differs from the commits",
            s,
            |s| draft(&history, &[8], s),
            "at position 6: token 5 in history, 3 seen",
        );
        check(
            "history dropped the next token",
            s,
            |s| draft(&driver.history[..8], &[4], s),
            "history has 8 tokens",
        );
        assert_eq!(driver.draft(4).expect("still usable"), Vec::<u32>::new());
    }

    /// A small fixed-seed generator (splitmix64) for the property test.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The specification, by brute force over the whole sequence.
    fn reference_draft(tokens: &[u32], config: PromptLookupConfig, max_tokens: usize) -> Vec<u32> {
        let limit = config
            .num_draft
            .map_or(max_tokens, |cap| cap.min(max_tokens));
        let len = tokens.len();
        for n in (config.min_ngram..=config.max_ngram.min(len)).rev() {
            let suffix = &tokens[len - n..];
            // Earlier occurrences end before `len`; the latest one wins.
            if let Some(end) = (n..len).rev().find(|&end| &tokens[end - n..end] == suffix) {
                // Past the end, the matched span repeats.
                return tokens[end..].iter().copied().cycle().take(limit).collect();
            }
        }
        Vec::new()
    }

    #[test]
    fn incremental_index_equals_a_rebuild_and_the_brute_force_reference() {
        let configs = [
            PromptLookupConfig {
                min_ngram: 1,
                max_ngram: 1,
                num_draft: None,
            },
            PromptLookupConfig {
                min_ngram: 1,
                max_ngram: 3,
                num_draft: None,
            },
            PromptLookupConfig::default(),
            PromptLookupConfig {
                min_ngram: 3,
                max_ngram: 5,
                num_draft: Some(3),
            },
        ];
        for (c, config) in configs.into_iter().enumerate() {
            for seed in 0..3u64 {
                let mut rng = Rng(seed * 1000 + c as u64);
                let vocab = 2 + rng.below(5) as u32;
                let prompt: Vec<u32> = (0..1 + rng.below(40))
                    .map(|_| rng.below(vocab as usize) as u32)
                    .collect();
                let mut driver = start(config, &prompt);
                let mut proposals = 0;
                for step in 0..150 {
                    let what = format!("config {config:?}, seed {seed}, step {step}");
                    if rng.below(8) == 0 {
                        driver.skip(rng.below(vocab as usize) as u32);
                        continue;
                    }
                    let max_tokens = 1 + rng.below(6);
                    let drafted = driver.draft(max_tokens).expect("draft");
                    assert_eq!(
                        drafted,
                        reference_draft(&driver.history, config, max_tokens),
                        "{what}"
                    );
                    proposals += usize::from(!drafted.is_empty());

                    let mut rebuilt = NgramIndex::new(config.min_ngram, config.max_ngram);
                    rebuilt.extend(&driver.history);
                    assert_eq!(driver.source.index, rebuilt, "{what}");

                    let accepted = rng.below(drafted.len() + 1);
                    driver
                        .commit(&drafted, accepted, rng.below(vocab as usize) as u32)
                        .expect("commit");
                }
                assert!(proposals >= 20, "config {config:?}, seed {seed}: only {proposals} proposals exercise the lookup");
            }
        }
    }
}
