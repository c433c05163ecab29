//! The `deepspec` source's protocol: prefill, draft, commit, the confidence
//! cut and typed errors on misuse; the provider's options and registration.

#![allow(clippy::unwrap_used)]

mod common;

use draft_deepspec::{DSparkError, DSparkProvider, DSparkSource, DrafterError, Options};
use mlx_rs::Array;
use spec_core::{
    CommitInfo, DraftProvider, DraftRequest, DraftSource, GreedySampler, InputError,
    ProviderOptions, SpecError,
};
use spec_runtime::LoadOptions;

fn provider(threshold: f32) -> (tempfile::TempDir, DSparkProvider) {
    let dir = common::checkpoint();
    let model = draft_deepspec::DSparkModel::load(dir.path(), &LoadOptions::default()).unwrap();
    let p = DSparkProvider::from_model(model, &common::target(), threshold).unwrap();
    (dir, p)
}

fn request<'a>(feed: &'a [u32], history: &'a [u32], n: usize) -> DraftRequest<'a> {
    DraftRequest {
        feed,
        max_tokens: n,
        anchor_hidden: None,
        history,
        target_caches: None,
    }
}

fn commit<'a>(
    drafted: usize,
    accepted: &'a [u32],
    taps: &'a Array,
    hidden: &'a Array,
) -> CommitInfo<'a> {
    CommitInfo {
        drafted,
        accepted: accepted.len(),
        accepted_tokens: accepted,
        foreign: &[],
        next: 0,
        verified_taps: Some(taps),
        verified_hidden: hidden,
    }
}

fn hidden() -> Array {
    Array::zeros::<f32>(&[1, 1, common::HIDDEN]).unwrap()
}

/// Prompt of 6 tokens: tail-split prefill gives the taps of the first 5.
fn prefilled(p: &DSparkProvider) -> (DSparkSource, Vec<u32>) {
    let mut s = p.source(&common::target()).unwrap();
    let prompt = vec![5, 6, 7, 8, 9, 10];
    s.prefill(&prompt, Some(&common::taps(5, 1))).unwrap();
    (s, prompt)
}

#[test]
fn rounds_grow_the_context_by_the_anchor_and_the_accepted_drafts() {
    let (_d, p) = provider(0.0);
    let (mut s, mut history) = prefilled(&p);
    assert_eq!(s.tap_layers(), &[0, 2]);
    assert_eq!(s.context_len(), 5);
    let d = s
        .draft(request(&[10], &history, 3), &mut GreedySampler)
        .unwrap();
    assert_eq!(d.tokens.len(), 3, "threshold 0 keeps min(n, block)");
    assert!(d.probs.is_none());
    assert_eq!(d.tokens, s.last_proposal().unwrap().tokens[..3]);
    let taps = common::taps(4, 2);
    s.commit(commit(3, &d.tokens[..1], &taps, &hidden()))
        .unwrap();
    assert_eq!(s.context_len(), 7, "pending + 1 accepted");
    history.extend_from_slice(&d.tokens[..1]);
    history.push(42);
    let d = s
        .draft(request(&[42], &history, 8), &mut GreedySampler)
        .unwrap();
    assert_eq!(d.tokens.len(), common::BLOCK, "never more than a block");
    let taps = common::taps(common::BLOCK as i32 + 1, 3);
    s.commit(commit(d.tokens.len(), &d.tokens.clone(), &taps, &hidden()))
        .unwrap();
    assert_eq!(s.context_len(), 7 + common::BLOCK + 1);
}

/// Tokens a host appends after the drafts (a constraint's forced tokens),
/// after all of them or in place of refused ones, join the context as the
/// same tokens drafted and accepted do: the next block is the same.
#[test]
fn foreign_tokens_join_the_context_as_accepted_drafts_do() {
    let (_d, p) = provider(0.0);
    for (own, kept) in [(1, 1), (3, 1)] {
        let (mut reference, history) = prefilled(&p);
        let (mut source, _) = prefilled(&p);
        assert!(source.takes_foreign_tokens() && !source.syncs_from_history());
        let all = reference
            .draft(request(&[10], &history, 3), &mut GreedySampler)
            .unwrap()
            .tokens;
        let drafts = source
            .draft(request(&[10], &history, own), &mut GreedySampler)
            .unwrap()
            .tokens;
        assert_eq!(drafts[..kept], all[..kept], "the same block");
        let taps = common::taps(4, 9);
        reference.commit(commit(3, &all, &taps, &hidden())).unwrap();
        source
            .commit(CommitInfo {
                foreign: &all[kept..],
                ..commit(own, &drafts[..kept], &taps, &hidden())
            })
            .unwrap();
        assert_eq!(source.context_len(), reference.context_len());
        let mut next = history.clone();
        next.extend_from_slice(&all);
        next.push(42);
        let theirs = reference
            .draft(request(&[42], &next, 3), &mut GreedySampler)
            .unwrap();
        let ours = source
            .draft(request(&[42], &next, 3), &mut GreedySampler)
            .unwrap();
        assert_eq!(ours.tokens, theirs.tokens, "{own} drafted, {kept} kept");
        assert_eq!(
            source.last_proposal().unwrap().confidences,
            reference.last_proposal().unwrap().confidences
        );
    }
}

#[test]
fn a_threshold_above_every_confidence_drafts_nothing_and_commits_the_anchor() {
    let (_d, p) = provider(0.999);
    let (mut s, history) = prefilled(&p);
    let d = s
        .draft(request(&[10], &history, 4), &mut GreedySampler)
        .unwrap();
    assert!(d.tokens.is_empty());
    assert_eq!(s.last_proposal().unwrap().tokens.len(), common::BLOCK);
    s.commit(commit(0, &[], &common::taps(1, 4), &hidden()))
        .unwrap();
    assert_eq!(s.context_len(), 6);
}

#[test]
fn the_cut_is_at_the_first_confidence_under_the_threshold() {
    let (_d, p0) = provider(0.0);
    let (mut s0, history) = prefilled(&p0);
    s0.draft(request(&[10], &history, 4), &mut GreedySampler)
        .unwrap();
    let c = s0.last_proposal().unwrap().confidences.clone().unwrap();
    // A threshold just above the k-th confidence keeps exactly the tokens before
    // the first confidence under it.
    for (k, &ck) in c.iter().enumerate() {
        let t = ck + 1e-6;
        let expected = c.iter().position(|&x| x < t).unwrap();
        assert!(expected <= k);
        let (_d, p) = provider(t);
        let (mut s, history) = prefilled(&p);
        let d = s
            .draft(request(&[10], &history, 4), &mut GreedySampler)
            .unwrap();
        assert_eq!(
            d.tokens.len(),
            expected,
            "threshold {t} over confidences {c:?}"
        );
    }
}

#[test]
fn misuse_is_a_typed_protocol_error() {
    let (_d, p) = provider(0.0);
    let target = common::target();
    // Draft before prefill.
    let mut s = p.source(&target).unwrap();
    assert!(matches!(
        s.draft(request(&[1], &[1], 2), &mut GreedySampler),
        Err(SpecError::Protocol(_))
    ));
    // Prefill taps that do not cover the prefilled prompt.
    assert!(matches!(
        s.prefill(&[1, 2, 3], Some(&common::taps(3, 1))),
        Err(SpecError::Input(InputError::Shape { .. }))
    ));
    assert!(matches!(
        s.prefill(&[1, 2, 3], None),
        Err(SpecError::Input(InputError::Shape { ref got, .. })) if got.is_empty()
    ));
    // A one-token prompt has nothing to prefill.
    let mut one = p.source(&target).unwrap();
    one.prefill(&[7], None).unwrap();
    assert!(one
        .draft(request(&[7], &[7], 2), &mut GreedySampler)
        .is_ok());

    // History out of step with the context poisons the source.
    let (mut s, _) = prefilled(&p);
    assert!(matches!(
        s.draft(request(&[10], &[1, 2, 10], 2), &mut GreedySampler),
        Err(SpecError::Protocol(_))
    ));
    assert!(
        matches!(s.draft(request(&[10], &[5, 6, 7, 8, 9, 10], 2), &mut GreedySampler), Err(SpecError::Protocol(m)) if m.contains("unusable"))
    );

    // Commit without a draft, draft twice, inconsistent counts, bad taps.
    let (mut s, history) = prefilled(&p);
    assert!(matches!(
        s.commit(commit(0, &[], &common::taps(1, 1), &hidden())),
        Err(SpecError::Protocol(_))
    ));
    let (mut s2, _) = prefilled(&p);
    s2.draft(request(&[10], &history, 2), &mut GreedySampler)
        .unwrap();
    assert!(matches!(
        s2.draft(request(&[10], &history, 2), &mut GreedySampler),
        Err(SpecError::Protocol(_))
    ));
    let (mut s3, _) = prefilled(&p);
    let d = s3
        .draft(request(&[10], &history, 2), &mut GreedySampler)
        .unwrap();
    let wrong = vec![d.tokens[0] ^ 1];
    let taps = common::taps(3, 1);
    assert!(matches!(
        s3.commit(commit(2, &wrong, &taps, &hidden())),
        Err(SpecError::Protocol(_))
    ));
    let (mut s4, _) = prefilled(&p);
    let d = s4
        .draft(request(&[10], &history, 2), &mut GreedySampler)
        .unwrap();
    // One accepted draft needs at least its row and the pending one's; a
    // window never holds more rows than the drafts and the pending token.
    for rows in [1, 4] {
        let wrong_rows = common::taps(rows, 1);
        let (mut s, _) = prefilled(&p);
        let d = s
            .draft(request(&[10], &history, 2), &mut GreedySampler)
            .unwrap();
        assert!(matches!(
            s.commit(commit(2, &d.tokens[..1], &wrong_rows, &hidden())),
            Err(SpecError::Protocol(_))
        ));
    }
    // Two rows: the host verified one draft of two (a constraint refused
    // the other): accepted.
    let verified_one = common::taps(2, 1);
    s4.commit(commit(2, &d.tokens[..1], &verified_one, &hidden()))
        .expect("a window cut after the first draft");
    let (mut s5, _) = prefilled(&p);
    let d = s5
        .draft(request(&[10], &history, 2), &mut GreedySampler)
        .unwrap();
    let info = CommitInfo {
        drafted: 3,
        accepted: 1,
        accepted_tokens: &d.tokens[..1],
        foreign: &[],
        next: 0,
        verified_taps: Some(&taps),
        verified_hidden: &hidden(),
    };
    assert!(matches!(s5.commit(info), Err(SpecError::Protocol(_))));
}

#[test]
fn options_are_checked() {
    let opts = |pairs: &[(&str, &str)]| -> ProviderOptions {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert!(Options::parse(&opts(&[])).is_err(), "model is required");
    assert!(Options::parse(&opts(&[("model", "/x"), ("temperature", "1")])).is_err());
    for bad in ["1.5", "-0.1", "x", "1"] {
        assert!(
            Options::parse(&opts(&[("model", "/x"), ("threshold", bad)])).is_err(),
            "{bad}"
        );
    }
    let o = Options::parse(&opts(&[
        ("model", "/x"),
        ("threshold", "0.25"),
        ("dtype", "keep"),
    ]))
    .unwrap();
    assert_eq!(o.threshold, 0.25);
    assert!(Options::parse(&opts(&[("model", "/x"), ("dtype", "f16")])).is_err());
}

#[test]
fn registered_under_deepspec_and_built_from_options() {
    let dir = common::checkpoint();
    let reg = spec_core::resolve(draft_deepspec::ID).unwrap();
    let mut o = ProviderOptions::new();
    o.insert("model".into(), dir.path().display().to_string());
    o.insert("threshold".into(), "0.3".into());
    let p = (reg.build)(&common::target(), &o).unwrap();
    assert_eq!(p.id(), "deepspec");
    let concrete = DSparkProvider::new(&common::target(), &Options::parse(&o).unwrap()).unwrap();
    assert!(concrete.model().weights_bytes() > 0);
    let mut small = common::target();
    small.0.hidden_size = 16;
    match (reg.build)(&small, &o) {
        Err(SpecError::ProviderFailed { id, source }) => {
            assert_eq!(id, "deepspec");
            // The drafter's own error survives as the source.
            let mismatch = source.downcast_ref::<DSparkError>().unwrap();
            assert!(matches!(
                mismatch,
                DSparkError::Drafter(DrafterError::TargetMismatch { .. })
            ));
            let message = source.to_string();
            assert!(message.contains("hidden_size"), "{message}")
        }
        other => panic!("{:?}", other.map(|p| p.id().to_owned())),
    }
}

/// A request naming no draft count drafts the drafter's trained block
/// width (config `block_size`), as mlx-bun pins it, not the generic 3.
#[test]
fn default_draft_count_is_the_trained_block_width() {
    let (_dir, p) = provider(0.0);
    assert_eq!(p.model().config().block_size, common::BLOCK);
    assert_eq!(DraftProvider::default_num_draft(&p), common::BLOCK);
    assert_ne!(common::BLOCK, 3, "the fixture must tell the two apart");
}

/// With a sampling (non-greedy) sampler the draft carries the distribution
/// each token was drawn from, for the verifier's rejection sampling: one
/// normalised row per kept token, giving that token positive probability.
#[test]
fn sampled_drafts_carry_their_distributions() {
    let (_d, p) = provider(0.0);
    let (mut s, history) = prefilled(&p);
    let mut sampler = spec_core::SamplerConfig {
        temperature: 1.0,
        top_k: 8,
        seed: 3,
        ..Default::default()
    }
    .build(common::VOCAB as usize)
    .unwrap();
    let d = s
        .draft(request(&[10], &history, 3), sampler.as_mut())
        .unwrap();
    assert_eq!(d.tokens.len(), 3);
    let probs = d.probs.expect("a sampled draft carries its distributions");
    assert_eq!(probs.shape(), &[3, common::VOCAB]);
    let rows = common::to_vec(&probs);
    for (i, &t) in d.tokens.iter().enumerate() {
        let row = &rows[i * common::VOCAB as usize..(i + 1) * common::VOCAB as usize];
        assert!(
            (row.iter().sum::<f32>() - 1.0).abs() < 1e-4,
            "row {i} sums to {}",
            row.iter().sum::<f32>()
        );
        assert!(row[t as usize] > 0.0, "token {t} drawn with probability 0");
        assert!(
            row.iter().filter(|&&x| x > 0.0).count() <= 8,
            "top-k 8 applied"
        );
    }
}
