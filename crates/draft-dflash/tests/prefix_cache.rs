//! `dflash` and a host's prefix cache, through the scheduler: a chat's next
//! turn starts from the saved context (A's prompt but its last token) and
//! equals a cold run: tokens, log-probability bits, drafted / accepted /
//! rounds.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;

use draft_dflash::DFlashProvider;
use serve_loop::{
    AdaptiveConfig, Output, PrefixCacheConfig, ProviderChoice, Request, ScheduleConfig, Scheduler,
    SpecConfig,
};
use spec_core::{DraftProvider, Target};

fn turn(
    target: &dyn Target,
    provider: &DFlashProvider,
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
            num_draft: common::BLOCK - 1,
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

#[test]
fn a_next_turn_starts_from_the_saved_context_and_equals_a_cold_run() {
    let drafters = [common::LAYOUT, common::DFLASH2_SLIDING];
    for (layout, vocab) in drafters.iter().flat_map(|d| [(d, d.vocab), (d, 6)]) {
        let spec = spec_fixtures::llama::Llama {
            vocab,
            ..common::target_specs()[0]
        };
        let (_t, target) = common::load_target(&spec);
        let drafter = tempfile::tempdir().unwrap();
        spec_fixtures::dflash::Dflash { vocab, ..*layout }
            .write(drafter.path())
            .unwrap();
        let provider = DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap();
        let a: Vec<u32> = (0..19u32).map(|i| (i * 11 + 2) % vocab as u32).collect();
        let first = turn(
            &target,
            &provider,
            std::slice::from_ref(&a),
            PrefixCacheConfig::off(),
        );
        let mut b = a.clone();
        b.extend(&first[0].tokens);
        b.extend([1, 2, 3, 4, 5]);
        let prompts = vec![a.clone(), b];
        let warm = turn(&target, &provider, &prompts, PrefixCacheConfig::default());
        let cold = turn(&target, &provider, &prompts[1..], PrefixCacheConfig::off());
        // The saved context covers A's prompt but its last token.
        assert_eq!(
            warm[1].cached_tokens,
            a.len() - 1,
            "{} vocab {vocab}",
            layout.name
        );
        assert_eq!(
            warm[1].tokens, cold[0].tokens,
            "{} vocab {vocab}",
            layout.name
        );
        let lp = |o: &Output| o.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
        assert_eq!(lp(&warm[1]), lp(&cold[0]));
        let stats = |o: &Output| (o.stats.drafted, o.stats.accepted, o.stats.rounds);
        assert_eq!(stats(&warm[1]), stats(&cold[0]));
        assert!(warm[1].stats.drafted > 0);
    }
}
