//! Suffix decoding through the real serve loop on a tiny model: lossless;
//! the provider's global tree makes a repeated request draft more; only
//! completed requests join it (a cancelled request, a failing source and a
//! failing target add nothing); tenants kept apart share nothing.

use std::cell::Cell;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use draft_suffix::{SuffixConfig, SuffixProvider};
use mlx_spec_scenarios::FailingTarget;
use serve_loop::{AdaptiveConfig, Finish, Output, ProviderChoice, Request, ServeError, SpecConfig};
use spec_core::{DraftProvider, Target};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, LoadOptions};

const PROMPT: &[u32] = &[3, 17, 42, 8, 55, 21, 9];

fn tiny_model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

/// One request of 32 tokens, 8 drafts a round; `cancel_after` sets the
/// cancel flag once that many tokens were emitted.
fn run_with(
    target: &dyn Target,
    provider: Option<&dyn DraftProvider>,
    tenant: Option<&str>,
    cancel_after: Option<usize>,
) -> Result<Output, ServeError> {
    let speculation = provider.map(|provider| {
        let config = SpecConfig {
            num_draft: 8,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        };
        ProviderChoice::new(provider.id(), config)
    });
    let cancel = Arc::new(AtomicBool::new(false));
    let emitted = Cell::new(0);
    let request = Request {
        speculation,
        cancel: Some(Arc::clone(&cancel)),
        tenant: tenant.map(str::to_owned),
        ..Request::new(PROMPT.to_vec(), 32)
    };
    serve_loop::generate(target, provider.as_slice(), request, |_| {
        emitted.set(emitted.get() + 1);
        if cancel_after.is_some_and(|n| emitted.get() >= n) {
            cancel.store(true, Ordering::Relaxed);
        }
        ControlFlow::Continue(())
    })
}

fn run(target: &dyn Target, provider: Option<&dyn DraftProvider>) -> Output {
    run_with(target, provider, None, None).expect("generate")
}

#[test]
fn a_repeated_request_drafts_more_from_the_global_tree_and_stays_lossless() {
    let (_dir, model) = tiny_model();
    let plain = run(&model, None);

    let provider = SuffixProvider::new(SuffixConfig::default()).expect("valid");
    let first = run(&model, Some(&provider));
    assert_eq!(provider.global().read().requests(), 1, "the first joined");
    let second = run(&model, Some(&provider));
    assert_eq!(first.tokens, plain.tokens, "lossless");
    assert_eq!(second.tokens, plain.tokens, "lossless");
    let (a, b) = (&first.stats, &second.stats);
    eprintln!(
        "first: {} accepted in {} forwards ({:.2}/forward); second: {} in {} ({:.2})",
        a.accepted,
        a.target_calls,
        a.tokens_per_forward(),
        b.accepted,
        b.target_calls,
        b.tokens_per_forward()
    );
    assert!(
        b.accepted > a.accepted && b.tokens_per_forward() > a.tokens_per_forward(),
        "first {a:?}, second {b:?}"
    );
    assert!(b.tokens_per_forward() >= 2.0, "second {b:?}");
}

#[test]
fn a_cancelled_request_adds_nothing_to_the_global_tree() {
    let (_dir, model) = tiny_model();
    let provider = SuffixProvider::new(SuffixConfig::default()).expect("valid");
    let out = run_with(&model, Some(&provider), None, Some(4)).expect("generate");
    assert_eq!(out.finish, Finish::Cancelled);
    assert!(!out.tokens.is_empty());
    assert_eq!(provider.global().read().requests(), 0);
    // The same provider still learns from a request that completes.
    run(&model, Some(&provider));
    assert_eq!(provider.global().read().requests(), 1);
}

/// Faults: a target failing mid-request (after some rounds committed) and a
/// request the suffix source itself refuses; neither adds anything, and the
/// provider serves correct output afterwards.
#[test]
fn faults_leave_the_global_tree_untouched() {
    let (_dir, model) = tiny_model();
    let plain = run(&model, None);
    let provider = SuffixProvider::new(SuffixConfig::default()).expect("valid");
    for fail_at in [2, 3, 5] {
        let failing = FailingTarget::new(model.as_ref(), fail_at);
        let err = run_with(&failing, Some(&provider), None, None).expect_err("fails");
        assert!(err.to_string().contains("injected"), "{err}");
        assert_eq!(provider.global().read().requests(), 0, "fail at {fail_at}");
    }
    assert_eq!(run(&model, Some(&provider)).tokens, plain.tokens);
    assert_eq!(provider.global().read().requests(), 1);
}

#[test]
fn tenants_kept_apart_draft_nothing_from_each_other() {
    let (_dir, model) = tiny_model();
    let plain = run(&model, None);
    let provider = SuffixProvider::new(SuffixConfig {
        global_per_tenant: true,
        ..Default::default()
    })
    .expect("valid");
    let spec = |tenant| {
        let out = run_with(&model, Some(&provider), Some(tenant), None).expect("generate");
        assert_eq!(out.tokens, plain.tokens, "lossless");
        out.stats
    };
    let a1 = spec("a");
    let b1 = spec("b");
    let a2 = spec("a");
    // `b` ran the very request `a` had completed, and drafted as if the
    // provider were new; `a`'s second run drafts from `a`'s first.
    assert_eq!(
        (b1.accepted, b1.target_calls),
        (a1.accepted, a1.target_calls)
    );
    assert!(a2.accepted > a1.accepted, "a1 {a1:?}, a2 {a2:?}");
    assert_eq!(provider.global_for(Some("a")).read().requests(), 2);
    assert_eq!(provider.global_for(Some("b")).read().requests(), 1);
    assert_eq!(provider.global().read().requests(), 0);
    // Kept apart is the default; shared (the operator's opt-in), the
    // second tenant drafts from the first's.
    assert!(SuffixConfig::default().global_per_tenant);
    let shared = SuffixProvider::new(SuffixConfig {
        global_per_tenant: false,
        ..Default::default()
    })
    .expect("valid");
    run_with(&model, Some(&shared), Some("a"), None).expect("generate");
    let b = run_with(&model, Some(&shared), Some("b"), None).expect("generate");
    assert!(b.stats.accepted > a1.accepted, "shared {:?}", b.stats);
}
