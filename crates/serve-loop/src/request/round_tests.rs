//! A round of a source that drafts cheaply: asked at its full length before
//! the goodput policy chooses the round's length (the profile's cap is what
//! it proposed), then cut; the source hears of the cut drafts as rejected.
//! A source that does not draft cheaply is asked only once its length is
//! known.

use std::cell::RefCell;
use std::rc::Rc;

use mlx_rs::Array;
use spec_core::{
    CacheSet, CommitInfo, Draft, DraftRequest, DraftSource, GreedySampler, Sampler, SpecError,
    SpecStats,
};

use super::round::Round;
use crate::{AdaptiveConfig, SpecConfig};

/// Proposes its script's drafts in turn and logs every call.
struct Scripted {
    cheap: bool,
    script: Vec<Vec<u32>>,
    log: Rc<RefCell<Vec<String>>>,
}

impl DraftSource for Scripted {
    fn syncs_from_history(&self) -> bool {
        true
    }
    fn cheap_to_draft(&self) -> bool {
        self.cheap
    }
    fn prefill(&mut self, _: &[u32], _: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(&mut self, r: DraftRequest<'_>, _: &mut dyn Sampler) -> Result<Draft, SpecError> {
        let mut tokens = self.script.remove(0);
        tokens.truncate(r.max_tokens);
        self.log
            .borrow_mut()
            .push(format!("draft {} -> {}", r.max_tokens, tokens.len()));
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.log
            .borrow_mut()
            .push(format!("commit {} {}", info.drafted, info.accepted));
        Ok(())
    }
}

const VOCAB: usize = 12;
const PENDING: u32 = 10;

/// A round over `script` whose controller drafts 6 tokens.
fn round(cheap: bool, script: &[&[u32]]) -> (Round<'static>, Rc<RefCell<Vec<String>>>) {
    let log = Rc::new(RefCell::new(Vec::new()));
    let source = Scripted {
        cheap,
        script: script.iter().map(|s| s.to_vec()).collect(),
        log: Rc::clone(&log),
    };
    let config = SpecConfig {
        num_draft: 8,
        adaptive: AdaptiveConfig {
            start_len: 6,
            ..AdaptiveConfig::default()
        },
        ..SpecConfig::default()
    };
    let round = Round::new(
        Some(Box::new(source)),
        Some("scripted".into()),
        &config,
        false,
        PENDING,
        None,
        0,
    );
    (round, log)
}

/// Logits over a window of `len` positions whose greedy picks are `picks`.
fn logits(picks: &[u32]) -> Array {
    let mut values = vec![0.0f32; picks.len() * VOCAB];
    for (i, &t) in picks.iter().enumerate() {
        values[i * VOCAB + t as usize] = 1.0;
    }
    Array::from_slice(&values, &[1, picks.len() as i32, VOCAB as i32])
}

/// Verifies the round's window against `picks` and commits it.
fn verify(round: &mut Round<'_>, picks: &[u32], stats: &mut SpecStats) -> usize {
    let history = [1, 2, PENDING];
    let (drafted, walked) = round
        .walk(&logits(picks), &history, &mut [], &mut GreedySampler, stats)
        .expect("walk");
    let hidden = Array::zeros::<f32>(&[1, picks.len() as i32, 4]).expect("hidden");
    round
        .commit(&drafted, &walked, &hidden, None)
        .expect("commit");
    walked.accepted
}

#[test]
fn a_cheap_source_drafts_before_its_length_is_chosen_and_hears_the_cut_as_rejected() {
    let caches = CacheSet::new(Vec::new());
    let history = [1, 2, PENDING];
    let mut stats = SpecStats::default();
    let (mut r, log) = round(true, &[&[3, 4, 5]]);
    let profile = r
        .profile(100, &history, &caches, &mut GreedySampler)
        .expect("a goodput row");
    // Asked at the controller's 6, it proposed 3: the cap is 3.
    assert_eq!(profile.cap, 3);
    assert_eq!(*log.borrow(), ["draft 6 -> 3"]);
    r.limit_to(1, profile.cap);
    let window = r
        .draft(100, &history, &caches, &mut GreedySampler, &mut stats)
        .expect("draft");
    assert_eq!(window, [PENDING, 3], "cut to the policy's length");
    assert_eq!(stats.cut_drafts, 2);
    assert_eq!(log.borrow().len(), 1, "drafted once");
    // The target takes the draft and then picks 7: of the 3 drafts the
    // source made, 1 was accepted.
    assert_eq!(verify(&mut r, &[3, 7], &mut stats), 1);
    assert_eq!(*log.borrow(), ["draft 6 -> 3", "commit 3 1"]);
}

#[test]
fn a_cheap_source_that_finds_nothing_is_sized_as_a_plain_row_and_still_committed() {
    let caches = CacheSet::new(Vec::new());
    let history = [1, 2, PENDING];
    let mut stats = SpecStats::default();
    let (mut r, log) = round(true, &[&[]]);
    let profile = r
        .profile(100, &history, &caches, &mut GreedySampler)
        .expect("a goodput row");
    assert_eq!(profile.cap, 0, "nothing to verify: no drafts to size");
    r.limit_to(0, profile.cap);
    let window = r
        .draft(100, &history, &caches, &mut GreedySampler, &mut stats)
        .expect("draft");
    assert_eq!(window, [PENDING]);
    assert_eq!(verify(&mut r, &[7], &mut stats), 0);
    // Asked, so told: every draft call has its commit.
    assert_eq!(*log.borrow(), ["draft 6 -> 0", "commit 0 0"]);
}

#[test]
fn a_source_that_does_not_draft_cheaply_is_asked_at_the_chosen_length() {
    let caches = CacheSet::new(Vec::new());
    let history = [1, 2, PENDING];
    let mut stats = SpecStats::default();
    let (mut r, log) = round(false, &[&[3, 4, 5, 6, 7, 8]]);
    let profile = r
        .profile(100, &history, &caches, &mut GreedySampler)
        .expect("a goodput row");
    assert_eq!(profile.cap, 6, "the controller's length");
    assert!(
        log.borrow().is_empty(),
        "not asked before its length is known"
    );
    r.limit_to(2, profile.cap);
    let window = r
        .draft(100, &history, &caches, &mut GreedySampler, &mut stats)
        .expect("draft");
    assert_eq!(window, [PENDING, 3, 4]);
    assert_eq!(stats.cut_drafts, 0);
    assert_eq!(verify(&mut r, &[3, 4, 9], &mut stats), 2);
    assert_eq!(*log.borrow(), ["draft 2 -> 2", "commit 2 2"]);
}
