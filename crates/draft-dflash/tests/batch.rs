//! `dflash` requests run together through one scheduler (each its own
//! source and context) give the tokens and log-probability bits each gives
//! alone: DFlash, and DFlash2 with a sliding layer.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;

use draft_dflash::DFlashProvider;
use serve_loop::{
    AdaptiveConfig, Output, PrefixCacheConfig, ProviderChoice, Request, ScheduleConfig, Scheduler,
    SpecConfig,
};
use spec_core::{DraftProvider, Target};
use spec_fixtures::dflash::Dflash;

fn request(provider: &DFlashProvider, prompt: &[u32]) -> Request {
    let config = SpecConfig {
        num_draft: common::BLOCK - 1,
        adaptive: AdaptiveConfig::off(),
        ..SpecConfig::default()
    };
    Request {
        speculation: Some(ProviderChoice::new(provider.id(), config)),
        ..Request::new(prompt.to_vec(), 16)
    }
}

fn together(target: &dyn Target, provider: &DFlashProvider, prompts: &[Vec<u32>]) -> Vec<Output> {
    let schedule = ScheduleConfig {
        max_batch: prompts.len(),
        prefill_chunk: 4,
        prefill_budget: 4096,
    };
    let mut scheduler = Scheduler::new(target, schedule)
        .unwrap()
        .with_providers(&[provider as &dyn DraftProvider])
        .with_prefix_cache(PrefixCacheConfig::off());
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| {
            scheduler
                .submit(request(provider, p), |_| ControlFlow::Continue(()))
                .unwrap()
        })
        .collect();
    let mut done = Vec::new();
    while !scheduler.is_idle() {
        done.extend(scheduler.step().finished);
    }
    ids.iter()
        .map(|id| {
            let i = done.iter().position(|f| f.id == *id).unwrap();
            done.remove(i).result.unwrap()
        })
        .collect()
}

#[test]
fn requests_together_equal_requests_alone() {
    let drafters = [common::LAYOUT, common::DFLASH2_SLIDING];
    for (layout, vocab) in drafters.iter().flat_map(|d| [(d, d.vocab), (d, 6)]) {
        let spec = spec_fixtures::llama::Llama {
            vocab,
            ..common::target_specs()[0]
        };
        let (_t, target) = common::load_target(&spec);
        let drafter = tempfile::tempdir().unwrap();
        Dflash { vocab, ..*layout }.write(drafter.path()).unwrap();
        let provider = DFlashProvider::from_model(common::load(drafter.path()), &target).unwrap();
        let prompts: Vec<Vec<u32>> = (0..3u32)
            .map(|i| (0..5 + 3 * i).map(|t| (t * 7 + i) % vocab as u32).collect())
            .collect();
        let batch = together(&target, &provider, &prompts);
        for (prompt, out) in prompts.iter().zip(&batch) {
            let alone = together(&target, &provider, std::slice::from_ref(prompt));
            assert_eq!(
                out.tokens, alone[0].tokens,
                "{} vocab {vocab} {prompt:?}",
                layout.name
            );
            let bits = |o: &Output| o.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(out), bits(&alone[0]));
            assert!(out.stats.drafted > 0);
        }
    }
}
