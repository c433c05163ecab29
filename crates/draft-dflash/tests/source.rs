//! The `dflash` source's protocol against a real tiny llama target: the
//! context grows by the pending token and the accepted drafts, a short
//! request shrinks the block, an incremental context drafts what a one-shot
//! one does, a prefix cache's saved context restores, and misuse is a typed
//! error.

#![allow(clippy::unwrap_used)]

mod common;

use draft_dflash::DFlashSource;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use spec_core::{CommitInfo, DraftRequest, DraftSource, GreedySampler, SpecError};
use spec_runtime::tap_context::TapContext;

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

fn argmax_rows(logits: &Array) -> Vec<u32> {
    let a = argmax_axis(logits, -1, None)
        .unwrap()
        .as_dtype(mlx_rs::Dtype::Uint32)
        .unwrap();
    a.eval().unwrap();
    a.as_slice::<u32>().to_vec()
}

const PROMPT: [u32; 6] = [5, 6, 7, 8, 9, 10];

#[test]
fn rounds_grow_the_context_and_draft_the_blocks_argmax() {
    let (_t, target, provider) = common::llama_and_provider();
    let mut s: DFlashSource<'_> = provider.source(&target).unwrap();
    assert_eq!(s.tap_layers(), &[0, 1]);
    let mut history = PROMPT.to_vec();
    s.prefill(&history, Some(&common::taps(5, 1))).unwrap();
    assert_eq!(s.context_len(), 5);

    let mut ctx = TapContext::default();
    provider
        .model()
        .extend_context(&mut ctx, &common::taps(5, 1))
        .unwrap();
    let d = s
        .draft(request(&[10], &history, 8), &mut GreedySampler)
        .unwrap();
    assert_eq!(
        d.tokens.len(),
        common::BLOCK - 1,
        "a whole block: every mask drafts"
    );
    assert!(d.probs.is_none());
    let full = provider
        .model()
        .block_logits(&target, &ctx, 10, common::BLOCK)
        .unwrap();
    assert_eq!(d.tokens, argmax_rows(&full));

    let taps = common::taps(d.tokens.len() as i32 + 1, 2);
    s.commit(commit(d.tokens.len(), &d.tokens[..1], &taps, &hidden()))
        .unwrap();
    assert_eq!(s.context_len(), 7, "pending + 1 accepted");
    history.extend_from_slice(&d.tokens[..1]);
    history.push(42);

    // One draft asked: a block of the anchor and one mask, as model_mlx.py
    // shrinks its last block (not the first row of a full block).
    provider
        .model()
        .extend_context(&mut ctx, &taps.index((.., ..2, ..)))
        .unwrap();
    let d = s
        .draft(request(&[42], &history, 1), &mut GreedySampler)
        .unwrap();
    let short = provider.model().block_logits(&target, &ctx, 42, 2).unwrap();
    assert_eq!(short.shape(), &[1, 1, common::LAYOUT.vocab as i32]);
    assert_eq!(d.tokens, argmax_rows(&short));
    let taps = common::taps(2, 3);
    s.commit(commit(1, &d.tokens, &taps, &hidden())).unwrap();
    assert_eq!(s.context_len(), 9);
}

/// The context grown round by round (each chunk roped at its own offset)
/// drafts what the context built in one go drafts; another context drafts
/// differently (the block reads it).
#[test]
fn incremental_context_equals_one_shot_context() {
    let (_t, target, provider) = common::llama_and_provider();
    let m = provider.model();
    let taps = common::taps(7, 3);
    let mut whole = TapContext::default();
    m.extend_context(&mut whole, &taps).unwrap();
    let mut parts = TapContext::default();
    for (a, b) in [(0, 3), (3, 4), (4, 7)] {
        m.extend_context(&mut parts, &taps.index((.., a..b, ..)))
            .unwrap();
    }
    assert_eq!((whole.len(), parts.len()), (7, 7));
    let x = m.block_logits(&target, &whole, 9, common::BLOCK).unwrap();
    let y = m.block_logits(&target, &parts, 9, common::BLOCK).unwrap();
    let worst = x
        .subtract(&y)
        .unwrap()
        .abs()
        .unwrap()
        .max(None)
        .unwrap()
        .item_exact::<f32>();
    assert!(worst < 1e-3, "largest difference {worst}");
    assert_eq!(argmax_rows(&x), argmax_rows(&y));
    let mut other = TapContext::default();
    m.extend_context(&mut other, &taps.index((.., 1..7, ..)))
        .unwrap();
    let z = m.block_logits(&target, &other, 9, common::BLOCK).unwrap();
    let moved = x
        .subtract(&z)
        .unwrap()
        .abs()
        .unwrap()
        .max(None)
        .unwrap()
        .item_exact::<f32>();
    assert!(moved > 1e-2, "the block ignores its context ({moved})");
    let w = m.block_logits(&target, &whole, 10, common::BLOCK).unwrap();
    let moved = x
        .subtract(&w)
        .unwrap()
        .abs()
        .unwrap()
        .max(None)
        .unwrap()
        .item_exact::<f32>();
    assert!(moved > 1e-2, "the block ignores its anchor ({moved})");
}

/// A prefix cache's saved context, kept to any prefix and completed with the
/// rest of the prompt's taps, drafts the bits a cold prefill drafts.
#[test]
fn a_restored_context_proposes_what_a_cold_one_does() {
    let (_t, target, provider) = common::llama_and_provider();
    let taps = common::taps(5, 4);
    let mut cold = provider.source(&target).unwrap();
    cold.prefill(&PROMPT, Some(&taps)).unwrap();
    let saved = cold.save_prefill().unwrap();
    assert_eq!(saved.tokens(), 5);
    let expected = cold
        .draft(request(&[10], &PROMPT, 8), &mut GreedySampler)
        .unwrap();
    assert!(
        cold.save_prefill().is_none(),
        "not while a draft is outstanding"
    );
    for keep in [0, 2, 5] {
        let mut warm = provider.source(&target).unwrap();
        let rest = taps.index((.., keep as i32.., ..));
        assert!(warm
            .prefill_from(saved.as_ref(), keep, &PROMPT, Some(&rest))
            .unwrap());
        assert_eq!(warm.context_len(), 5);
        let d = warm
            .draft(request(&[10], &PROMPT, 8), &mut GreedySampler)
            .unwrap();
        assert_eq!(d.tokens, expected.tokens, "keep {keep}");
    }
    let mut warm = provider.source(&target).unwrap();
    assert!(
        !warm.prefill_from(saved.as_ref(), 6, &PROMPT, None).unwrap(),
        "more rows than the prompt's prefill"
    );
}

#[test]
fn misuse_is_a_typed_error_and_poisons_the_source() {
    let (_t, target, provider) = common::llama_and_provider();
    let mut s = provider.source(&target).unwrap();
    assert!(matches!(
        s.draft(request(&[10], &PROMPT, 3), &mut GreedySampler),
        Err(SpecError::Protocol(_))
    ));
    assert!(matches!(
        s.prefill(&PROMPT, Some(&common::taps(4, 1))),
        Err(SpecError::Input(_))
    ));
    s.prefill(&PROMPT, Some(&common::taps(5, 1))).unwrap();
    assert!(
        s.prefill(&PROMPT, Some(&common::taps(5, 1))).is_err(),
        "twice"
    );
    let taps = common::taps(2, 1);
    assert!(matches!(
        s.commit(commit(1, &[], &taps, &hidden())),
        Err(SpecError::Protocol(_))
    ));
    let err = s
        .draft(request(&[10], &PROMPT, 3), &mut GreedySampler)
        .unwrap_err();
    assert!(err.to_string().contains("unusable"), "{err}");

    // A history that disagrees with the context.
    let mut s = provider.source(&target).unwrap();
    s.prefill(&PROMPT, Some(&common::taps(5, 1))).unwrap();
    let err = s
        .draft(request(&[10], &PROMPT[1..], 3), &mut GreedySampler)
        .unwrap_err();
    assert!(err.to_string().contains("context holds 5 rows"), "{err}");

    // Verified taps of the wrong width.
    let mut s = provider.source(&target).unwrap();
    s.prefill(&PROMPT, Some(&common::taps(5, 1))).unwrap();
    let d = s
        .draft(request(&[10], &PROMPT, 3), &mut GreedySampler)
        .unwrap();
    let narrow = Array::zeros::<f32>(&[1, 4, common::HIDDEN]).unwrap();
    let err = s
        .commit(commit(d.tokens.len(), &[], &narrow, &hidden()))
        .unwrap_err();
    assert!(err.to_string().contains("verified taps"), "{err}");
}

/// Tokens a host appends after the drafts (a constraint's forced tokens),
/// after all of them or in place of refused ones, join the context as the
/// same tokens drafted and accepted do: the next block is the same.
#[test]
fn foreign_tokens_join_the_context_as_accepted_drafts_do() {
    let (_t, target, provider) = common::llama_and_provider();
    let prefilled = || {
        let mut s = provider.source(&target).unwrap();
        s.prefill(&PROMPT, Some(&common::taps(5, 1))).unwrap();
        s
    };
    for kept in [0, 1, 3] {
        let (mut reference, mut source) = (prefilled(), prefilled());
        assert!(source.takes_foreign_tokens() && !source.syncs_from_history());
        let all = reference
            .draft(request(&[10], &PROMPT, 3), &mut GreedySampler)
            .unwrap()
            .tokens;
        let drafts = source
            .draft(request(&[10], &PROMPT, 3), &mut GreedySampler)
            .unwrap()
            .tokens;
        assert_eq!(drafts, all);
        let taps = common::taps(4, 9);
        reference.commit(commit(3, &all, &taps, &hidden())).unwrap();
        source
            .commit(CommitInfo {
                foreign: &all[kept..],
                ..commit(3, &drafts[..kept], &taps, &hidden())
            })
            .unwrap();
        assert_eq!(source.context_len(), reference.context_len());
        let mut next = PROMPT.to_vec();
        next.extend_from_slice(&all);
        next.push(42);
        let theirs = reference
            .draft(request(&[42], &next, 3), &mut GreedySampler)
            .unwrap();
        let ours = source
            .draft(request(&[42], &next, 3), &mut GreedySampler)
            .unwrap();
        assert_eq!(ours.tokens, theirs.tokens, "{kept} kept");
    }
}
