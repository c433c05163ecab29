//! Providers through the registry and the serve loop: a third-party crate's
//! provider runs a request by id; unknown ids list what exists; a provider
//! or target failing mid-round leaves the model serving correct output.

use std::ops::ControlFlow;

use mlx_rs::Array;
use mlx_spec_scenarios::{greedy_with, FailingTarget};
use serve_loop::ServeError;
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, ProviderOptions, Sampler,
    SpecError, Target,
};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, LoadOptions};

fn tiny_model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

const PROMPTS: &[&[u32]] = &[
    &[5],
    &[1, 2, 3, 4, 5, 6],
    &[9, 9, 9, 9, 10, 11, 9, 9, 9],
    &[40, 41, 42, 43, 40, 41, 42],
];

fn run(
    target: &dyn Target,
    prompt: &[u32],
    provider: Option<&dyn DraftProvider>,
) -> Result<Vec<u32>, ServeError> {
    let out = greedy_with(target, prompt, provider, 24, None, |_| {
        ControlFlow::Continue(())
    })?;
    Ok(out.tokens)
}

#[test]
fn a_third_party_provider_runs_a_request_by_id() {
    let (_dir, model) = tiny_model();
    let ids: Vec<&str> = spec_core::registrations().iter().map(|r| r.id).collect();
    assert!(ids.contains(&third_party_provider::ID), "{ids:?}");
    let provider =
        serve_loop::build_provider(third_party_provider::ID, &model, &ProviderOptions::new())
            .expect("build");
    for prompt in PROMPTS {
        let plain = run(&model, prompt, None).expect("plain");
        assert_eq!(plain.len(), 24);
        assert_eq!(
            run(&model, prompt, Some(provider.as_ref())).expect("speculative"),
            plain,
            "prompt {prompt:?}"
        );
    }
}

#[test]
fn unknown_provider_ids_list_the_available_ones() {
    let (_dir, model) = tiny_model();
    let err = serve_loop::build_provider("no-such-provider", &model, &ProviderOptions::new())
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        err.contains("no-such-provider") && err.contains(third_party_provider::ID),
        "{err}"
    );
    let bad = ProviderOptions::from([("x".to_owned(), "1".to_owned())]);
    let err = serve_loop::build_provider(third_party_provider::ID, &model, &bad)
        .err()
        .expect("must fail")
        .to_string();
    assert!(err.contains("`x`"), "{err}");
}

/// Where a fault is injected.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Draft(usize),
    Commit(usize),
    Forward(usize),
}

/// Drafts the next plain-greedy tokens (perfect drafts, so rounds are long)
/// and fails on cue.
#[derive(Clone)]
struct Faulty {
    fault: Fault,
    reference: Vec<u32>,
    prompt_len: usize,
}

struct FaultySource {
    provider: Faulty,
    drafts: usize,
    commits: usize,
}

impl DraftSource for FaultySource {
    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.drafts += 1;
        if matches!(self.provider.fault, Fault::Draft(k) if k == self.drafts) {
            return Err(SpecError::Model("injected draft failure".into()));
        }
        let done = request.history.len() - self.provider.prompt_len;
        let tokens = self
            .provider
            .reference
            .iter()
            .skip(done)
            .take(request.max_tokens)
            .copied()
            .collect();
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, _info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.commits += 1;
        if matches!(self.provider.fault, Fault::Commit(k) if k == self.commits) {
            return Err(SpecError::Model("injected commit failure".into()));
        }
        Ok(())
    }
}

impl DraftProvider for Faulty {
    fn id(&self) -> &str {
        "faulty"
    }
    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(FaultySource {
            provider: self.clone(),
            drafts: 0,
            commits: 0,
        }))
    }
}

#[test]
fn faults_mid_round_leave_the_model_serving_correct_output() {
    let (_dir, model) = tiny_model();
    faults_leave_correct_output(&model);
}

#[test]
fn faults_mid_round_leave_a_hybrid_model_serving_correct_output() {
    // Its recurrent states roll back to the failed step's start.
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::qwen3_next::GATE
        .tiny(7)
        .write(dir.path())
        .expect("fixture");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    faults_leave_correct_output(&model);
}

fn faults_leave_correct_output(model: &Model) {
    let prompt: &[u32] = &[3, 1, 4, 1, 5, 9, 2, 6];
    let baseline = run(model, prompt, None).expect("plain");
    for fault in [
        Fault::Draft(1),
        Fault::Draft(3),
        Fault::Commit(1),
        Fault::Commit(2),
        Fault::Forward(2),
        Fault::Forward(4),
    ] {
        let provider = Faulty {
            fault,
            reference: baseline.clone(),
            prompt_len: prompt.len(),
        };
        let fail_at = match fault {
            Fault::Forward(k) => k,
            _ => usize::MAX,
        };
        let failing = FailingTarget::after_caches(model.as_ref(), fail_at);
        let err = run(&failing, prompt, Some(&provider)).expect_err("the fault must surface");
        assert!(err.to_string().contains("injected"), "{fault:?}: {err}");
        // The next requests on the same model, plain and speculative, are right.
        assert_eq!(
            run(model, prompt, None).expect("plain after fault"),
            baseline,
            "{fault:?}"
        );
        let clean = Faulty {
            fault: Fault::Draft(usize::MAX),
            reference: baseline.clone(),
            prompt_len: prompt.len(),
        };
        assert_eq!(
            run(model, prompt, Some(&clean)).expect("speculative after fault"),
            baseline,
            "{fault:?}"
        );
    }
}

/// The published drafters' providers (EAGLE-3, DFlash) built by id on a
/// tiny llama their synthetic checkpoints were drawn for: a target forward
/// failing mid-request fails that request alone, and the next requests on
/// the same model and provider give plain decoding's tokens.
#[test]
fn faults_mid_round_leave_the_published_drafters_serving_correct_output() {
    use draft_dflash as _;
    use draft_eagle3 as _;
    let (target_dir, head) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    mlx_spec_scenarios::write_tiny_eagle3_pair(target_dir.path(), head.path())
        .expect("write the pair");
    let model = load_model(target_dir.path(), &LoadOptions::default()).expect("load target");
    let drafter = tempfile::tempdir().expect("tempdir");
    spec_fixtures::dflash::Dflash {
        taps: &[1, 3],
        target_layers: 4,
        ..spec_fixtures::dflash::Dflash::tiny()
    }
    .write(drafter.path())
    .expect("write drafter");
    let prompt: &[u32] = &[3, 1, 4, 1, 5, 9, 2, 6];
    let baseline = run(&model, prompt, None).expect("plain");
    for (id, dir) in [("eagle3", head.path()), ("dflash", drafter.path())] {
        let options: ProviderOptions = [("model", dir.display().to_string())].into_iter().collect();
        let provider = serve_loop::build_provider(id, &model, &options).expect("build");
        for fail_at in [2, 3, 5] {
            let failing = FailingTarget::after_caches(model.as_ref(), fail_at);
            let err =
                run(&failing, prompt, Some(provider.as_ref())).expect_err("the fault must surface");
            assert!(
                err.to_string().contains("injected"),
                "{id} at {fail_at}: {err}"
            );
            assert_eq!(
                run(&model, prompt, Some(provider.as_ref())).expect("speculative after fault"),
                baseline,
                "{id} after a failure at forward {fail_at}"
            );
        }
    }
}

/// `draft-model` with a drafter whose first layer slides over 4 positions:
/// past the window its ring cannot drop rejected drafts, so each round that
/// rejects some starts again from the caches it began with and replays
/// what it keeps. Output equals plain decoding's; drafting goes on past the
/// window; the drafter's next drafts equal a fresh drafter's on the same
/// history (checked by the target's acceptance of a drafter that is the
/// target itself).
#[test]
fn a_sliding_drafter_rolls_back_past_its_window() {
    use draft_model as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, other_dir, same_dir) = (
        dir.path().join("target"),
        dir.path().join("other"),
        dir.path().join("same"),
    );
    for (d, seed) in [(&target_dir, 7), (&other_dir, 8), (&same_dir, 7)] {
        std::fs::create_dir(d).expect("mkdir");
        mlx_spec_scenarios::write_tiny_llama_with(d, seed, Some(4)).expect("write");
    }
    let target = load_model(&target_dir, &LoadOptions::default()).expect("load");
    for drafter in [&other_dir, &same_dir] {
        let mut options = ProviderOptions::new();
        options.insert("model".into(), drafter.to_string_lossy().into_owned());
        let provider =
            serve_loop::build_provider("draft-model", target.as_ref(), &options).expect("drafter");
        let mut rejected = 0;
        for prompt in PROMPTS {
            let plain = run(target.as_ref(), prompt, None).expect("plain");
            let out = greedy_with(
                target.as_ref(),
                prompt,
                Some(provider.as_ref()),
                24,
                None,
                |_| ControlFlow::Continue(()),
            )
            .expect("speculative");
            assert_eq!(out.tokens, plain, "{prompt:?}");
            let stats = &out.stats;
            assert_eq!(
                stats.drafted_by_pos.first(),
                Some(&stats.rounds),
                "every round drafted, past the window too: {stats:?}"
            );
            if drafter == &same_dir {
                assert_eq!(stats.accepted, stats.drafted, "its own drafts: {stats:?}");
            }
            rejected += stats.rejected;
        }
        if drafter == &other_dir {
            assert!(rejected > 0, "rejections to roll back");
        }
    }
}
