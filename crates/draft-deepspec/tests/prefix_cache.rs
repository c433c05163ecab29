//! `deepspec` and a host's prefix cache: a source restored from a saved
//! prefill (`save_prefill` / `prefill_from`, its context kept to a token
//! boundary and the rest projected from the new taps) proposes what a cold
//! source proposes, bit for bit; it declines what its state does not
//! cover; through the scheduler a chat's next turn starts from the cached
//! prefix and equals a cold run.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;

use draft_deepspec::{DSparkModel, DSparkProvider, DSparkSource};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serve_loop::{
    AdaptiveConfig, Output, PrefixCacheConfig, ProviderChoice, Request, ScheduleConfig, Scheduler,
    SpecConfig,
};
use spec_core::{DraftProvider, DraftRequest, DraftSource, GreedySampler, Target};
use spec_models::{load_model, LoadOptions, LoadedModel};

fn bits(a: &Array) -> Vec<u32> {
    common::to_vec(a).iter().map(|v| v.to_bits()).collect()
}

/// The next block's tokens and the log-probabilities they came from.
fn proposal(source: &mut DSparkSource, history: &[u32]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let feed = [history[history.len() - 1]];
    let request = DraftRequest {
        feed: &feed,
        max_tokens: common::BLOCK,
        anchor_hidden: None,
        history,
        target_caches: None,
    };
    let draft = source.draft(request, &mut GreedySampler).unwrap();
    let last = source.last_proposal().unwrap();
    (draft.tokens, last.logprobs.iter().map(bits).collect())
}

#[test]
fn a_restored_context_proposes_what_a_cold_one_does() {
    let dir = common::checkpoint();
    let model = DSparkModel::load(dir.path(), &LoadOptions::default()).unwrap();
    let provider = DSparkProvider::from_model(model, &common::target(), 0.0).unwrap();
    let a: Vec<u32> = (0..23u32).map(|i| (i * 5 + 1) % 60).collect();
    let taps_a = common::taps(a.len() as i32 - 1, 1);
    let mut first = provider.source(&common::target()).unwrap();
    first.prefill(&a, Some(&taps_a)).unwrap();
    let saved = first.save_prefill().unwrap();
    assert_eq!(saved.tokens(), a.len() - 1);
    for keep in [22usize, 13, 1] {
        // B shares A's first `keep` tokens, and their taps.
        let mut b = a[..keep].to_vec();
        b.extend((0..9u32).map(|i| (i * 7 + 3) % 60));
        let rest = common::taps((b.len() - 1 - keep) as i32, 2 + keep as u64);
        let taps_b =
            concatenate(&[taps_a.index((.., ..keep as i32, ..)), rest.clone()], 1).unwrap();
        let mut warm = provider.source(&common::target()).unwrap();
        assert!(warm
            .prefill_from(saved.as_ref(), keep, &b, Some(&rest))
            .unwrap());
        let mut cold = provider.source(&common::target()).unwrap();
        cold.prefill(&b, Some(&taps_b)).unwrap();
        assert_eq!(warm.context_len(), cold.context_len(), "keep {keep}");
        assert_eq!(
            proposal(&mut warm, &b),
            proposal(&mut cold, &b),
            "keep {keep}"
        );
    }
    // Past what the state covers: declined, the source untouched.
    let mut b = a.clone();
    b.extend([1, 2, 3]);
    let mut past = provider.source(&common::target()).unwrap();
    let rest = common::taps(2, 9);
    assert!(!past
        .prefill_from(saved.as_ref(), 23, &b, Some(&rest))
        .unwrap());
    assert_eq!(past.context_len(), 0);
    // Taps that do not fit the rest of the prompt are an error.
    let mut wrong = provider.source(&common::target()).unwrap();
    assert!(wrong
        .prefill_from(saved.as_ref(), 20, &b, Some(&rest))
        .is_err());
}

fn turn(
    target: &dyn Target,
    provider: &DSparkProvider,
    prompts: &[Vec<u32>],
    cache: PrefixCacheConfig,
) -> Vec<Output> {
    let schedule = ScheduleConfig {
        max_batch: 2,
        prefill_chunk: 4,
        prefill_budget: 4096,
    };
    let mut scheduler = Scheduler::new(target, schedule)
        .unwrap()
        .with_providers(&[provider as &dyn DraftProvider])
        .with_prefix_cache(cache);
    let mut outputs = Vec::new();
    for prompt in prompts {
        let config = SpecConfig {
            num_draft: common::BLOCK,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        };
        let request = Request {
            speculation: Some(ProviderChoice::new(provider.id(), config)),
            ..Request::new(prompt.clone(), 12)
        };
        scheduler
            .submit(request, |_| ControlFlow::Continue(()))
            .unwrap();
        while !scheduler.is_idle() {
            outputs.extend(
                scheduler
                    .step()
                    .finished
                    .into_iter()
                    .map(|f| f.result.unwrap()),
            );
        }
    }
    outputs
}

/// The tiny llama target, a deepspec provider for it, and a first prompt.
fn chat_setup() -> (LoadedModel, DSparkProvider, Vec<u32>) {
    let target_dir = tempfile::tempdir().unwrap();
    common::tiny_llama(target_dir.path());
    let target = load_model(target_dir.path(), &LoadOptions::default()).unwrap();
    let drafter = common::checkpoint();
    let model = DSparkModel::load(drafter.path(), &LoadOptions::default()).unwrap();
    let provider = DSparkProvider::from_model(model, &target, 0.0).unwrap();
    let a: Vec<u32> = (0..19u32).map(|i| (i * 11 + 2) % 60).collect();
    (target, provider, a)
}

#[test]
fn a_next_turn_starts_from_the_saved_context_and_equals_a_cold_run() {
    let (target, provider, a) = chat_setup();
    let first = turn(
        &target,
        &provider,
        std::slice::from_ref(&a),
        PrefixCacheConfig::off(),
    );
    let mut b = a.clone();
    b.extend(&first[0].tokens);
    b.extend([7, 8, 9, 10, 11]);
    let prompts = vec![a.clone(), b];
    let warm = turn(&target, &provider, &prompts, PrefixCacheConfig::default());
    let cold = turn(&target, &provider, &prompts[1..], PrefixCacheConfig::off());
    // The saved context covers A's prompt but its last token: the hit
    // stops there (the target alone could reuse A's answer too).
    assert_eq!(warm[1].cached_tokens, a.len() - 1);
    assert_eq!(warm[1].tokens, cold[0].tokens);
    let lp = |o: &Output| o.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(lp(&warm[1]), lp(&cold[0]));
    assert_eq!(
        (
            warm[1].stats.drafted,
            warm[1].stats.accepted,
            warm[1].stats.rounds
        ),
        (
            cold[0].stats.drafted,
            cold[0].stats.accepted,
            cold[0].stats.rounds
        )
    );
    assert!(warm[1].stats.drafted > 0);
}

/// Copies of one prompt submitted together: the first prefills it, the
/// others wait for its prefill to end (the saved context a source reading
/// tapped layers needs comes with it) and start from `len - 1`, each equal
/// to the prompt run cold.
#[test]
fn copies_submitted_together_share_the_prefill_and_its_saved_context() {
    let (target, provider, a) = chat_setup();
    let cold = turn(
        &target,
        &provider,
        std::slice::from_ref(&a),
        PrefixCacheConfig::off(),
    );
    let schedule = ScheduleConfig {
        max_batch: 4,
        prefill_chunk: 4,
        prefill_budget: 4096,
    };
    let mut scheduler = Scheduler::new(&target, schedule)
        .unwrap()
        .with_providers(&[&provider as &dyn DraftProvider])
        .with_prefix_cache(PrefixCacheConfig::default());
    let config = SpecConfig {
        num_draft: common::BLOCK,
        adaptive: AdaptiveConfig::off(),
        ..SpecConfig::default()
    };
    let ids: Vec<_> = (0..3)
        .map(|_| {
            let request = Request {
                speculation: Some(ProviderChoice::new(provider.id(), config.clone())),
                ..Request::new(a.clone(), 12)
            };
            scheduler
                .submit(request, |_| ControlFlow::Continue(()))
                .unwrap()
        })
        .collect();
    let mut done = Vec::new();
    while !scheduler.is_idle() {
        done.extend(scheduler.step().finished);
    }
    let lp = |o: &Output| o.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    for (i, id) in ids.iter().enumerate() {
        let out = done
            .iter()
            .find(|f| f.id == *id)
            .and_then(|f| f.result.as_ref().ok())
            .unwrap();
        let want = if i == 0 { 0 } else { a.len() - 1 };
        assert_eq!(out.cached_tokens, want, "copy {i}");
        assert_eq!(out.tokens, cold[0].tokens, "copy {i}");
        assert_eq!(lp(out), lp(&cold[0]), "copy {i}");
        assert_eq!(
            (out.stats.drafted, out.stats.accepted),
            (cold[0].stats.drafted, cold[0].stats.accepted),
            "copy {i}"
        );
    }
    assert_eq!(scheduler.prefix_cache_stats().draft_restores, 2);
}
