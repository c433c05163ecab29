//! Prefill shared between requests in flight, through the scheduler with
//! the prefix cache on: requests submitted together whose prompts start
//! alike (copies of one prompt, one system prompt with other turns) run
//! the shared tokens once: the first prefills them, the others wait for
//! the prefix it publishes and start from it (`cached_tokens`), and each
//! gives the tokens, log-probabilities (bits), finish and draft counts it
//! gives run alone and cold. On a split-invariant target (llama) the whole
//! shared prefix is shared; on GLM and the hybrid Qwen models, the prefill
//! grid's points within it. A short shared prefix, another tenant, or a
//! leader that is cancelled leaves the others to prefill on their own.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use draft_glm52_mtp as _;
use draft_prompt_lookup as _;
use serve_loop::{
    AdaptiveConfig, Output, PrefixCacheConfig, ProviderChoice, Request, ScheduleConfig, Scheduler,
    SpecConfig,
};
use spec_core::{DraftProvider, ProviderOptions, Target};
use spec_fixtures::glm::Glm;
use spec_models::{load_model, LoadOptions, LoadedModel};

const CHUNK: usize = 4;

fn schedule(max_batch: usize) -> ScheduleConfig {
    ScheduleConfig {
        max_batch,
        prefill_chunk: CHUNK,
        prefill_budget: 4096,
    }
}

fn request(prompt: &[u32], provider: Option<&dyn DraftProvider>) -> Request {
    Request {
        speculation: provider.map(|p| {
            let config = SpecConfig {
                num_draft: 3,
                adaptive: AdaptiveConfig::off(),
                ..SpecConfig::default()
            };
            ProviderChoice::new(p.id(), config)
        }),
        ..Request::new(prompt.to_vec(), 10)
    }
}

/// Submits `requests` together and steps until every one has ended;
/// returns their outputs in submission order and the requests waiting
/// after the first step.
fn together(
    target: &dyn Target,
    provider: Option<&dyn DraftProvider>,
    requests: Vec<Request>,
    max_batch: usize,
) -> (Vec<Output>, usize) {
    let mut scheduler = Scheduler::new(target, schedule(max_batch))
        .expect("scheduler")
        .with_providers(provider.as_slice())
        .with_prefix_cache(PrefixCacheConfig::default());
    let ids: Vec<_> = requests
        .into_iter()
        .map(|r| {
            scheduler
                .submit(r, |_| ControlFlow::Continue(()))
                .expect("submit")
        })
        .collect();
    let mut done = Vec::new();
    let mut waiting = None;
    let mut steps = 0;
    while !scheduler.is_idle() {
        steps += 1;
        assert!(steps < 500, "the requests never ended");
        done.extend(scheduler.step().finished);
        waiting.get_or_insert(scheduler.queued());
    }
    let outputs = ids
        .iter()
        .map(|id| {
            let f = done.iter_mut().find(|f| f.id == *id).expect("finished");
            std::mem::replace(&mut f.result, Err(serve_loop::ServeError::EmptyPrompt))
                .expect("request")
        })
        .collect();
    (outputs, waiting.unwrap_or(0))
}

/// `prompt` run alone with no prefix cache.
fn cold(target: &dyn Target, provider: Option<&dyn DraftProvider>, prompt: &[u32]) -> Output {
    let mut scheduler = Scheduler::new(target, schedule(1))
        .expect("scheduler")
        .with_providers(provider.as_slice());
    scheduler
        .submit(request(prompt, provider), |_| ControlFlow::Continue(()))
        .expect("submit");
    let mut out = None;
    while !scheduler.is_idle() {
        for f in scheduler.step().finished {
            out = Some(f.result.expect("cold request"));
        }
    }
    out.expect("output")
}

fn bits(o: &Output) -> Vec<u32> {
    o.logprobs.iter().map(|l| l.to_bits()).collect()
}

fn assert_same(name: &str, shared: &Output, cold: &Output) {
    assert_eq!(shared.tokens, cold.tokens, "{name}: tokens");
    assert_eq!(bits(shared), bits(cold), "{name}: log-probabilities");
    assert_eq!(shared.finish, cold.finish, "{name}: finish");
    assert_eq!(
        (shared.stats.drafted, shared.stats.accepted),
        (cold.stats.drafted, cold.stats.accepted),
        "{name}: acceptance"
    );
}

const SYSTEM: [u32; 14] = [40, 41, 42, 43, 9, 9, 40, 41, 42, 7, 8, 40, 41, 42];

/// The system prompt and a turn of its own.
fn turn(tail: [u32; 4]) -> Vec<u32> {
    SYSTEM.iter().copied().chain(tail).collect()
}

/// Checks one target: `shared` is what a request with the system prompt
/// in common starts from (the whole of it, or its last grid point).
fn check(target: &dyn Target, name: &str, provider: Option<&dyn DraftProvider>, shared: usize) {
    let one = turn([3, 5, 6, 2]);
    let ask = |prompts: &[Vec<u32>]| prompts.iter().map(|p| request(p, provider)).collect();
    // Three copies of one prompt: one prefill.
    let copies = vec![one.clone(); 3];
    let (outputs, waiting) = together(target, provider, ask(&copies), 4);
    let alone = cold(target, provider, &one);
    let cached: Vec<usize> = outputs.iter().map(|o| o.cached_tokens).collect();
    assert_eq!(cached, [0, one.len() - 1, one.len() - 1], "{name}: copies");
    assert_eq!(
        waiting, 2,
        "{name}: copies wait for the first one's prefill"
    );
    for (i, o) in outputs.iter().enumerate() {
        assert_same(&format!("{name}: copy {i}"), o, &alone);
    }
    // One system prompt, three turns.
    let turns = vec![one.clone(), turn([11, 12, 13, 2]), turn([16, 17, 18, 2])];
    let (outputs, _) = together(target, provider, ask(&turns), 4);
    let cached: Vec<usize> = outputs.iter().map(|o| o.cached_tokens).collect();
    assert_eq!(cached, [0, shared, shared], "{name}: turns");
    for (i, (o, p)) in outputs.iter().zip(&turns).enumerate() {
        assert_same(&format!("{name}: turn {i}"), o, &cold(target, provider, p));
    }
}

fn load(dir: &std::path::Path) -> LoadedModel {
    load_model(dir, &LoadOptions::default()).expect("load")
}

fn build(id: &str, model: &dyn Target) -> Box<dyn DraftProvider> {
    serve_loop::build_provider(id, model, &ProviderOptions::new()).expect(id)
}

#[test]
fn llama_requests_sharing_a_prompt_prefill_it_once_and_equal_cold_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write");
    let model = load(dir.path());
    assert!(model.split_invariant());
    check(&model, "llama plain", None, SYSTEM.len());
    let lookup = build("prompt-lookup", &model);
    check(
        &model,
        "llama prompt-lookup",
        Some(lookup.as_ref()),
        SYSTEM.len(),
    );
}

#[test]
fn glm_and_hybrid_requests_share_the_prefill_grid() {
    let grid = SYSTEM.len() / CHUNK * CHUNK;
    let dir = tempfile::tempdir().expect("tempdir");
    Glm::default().write(dir.path()).expect("write");
    let model = load(dir.path());
    assert!(!model.split_invariant());
    check(&model, "glm plain", None, grid);
    let mtp = build("glm52-native-mtp", &model);
    check(&model, "glm mtp", Some(mtp.as_ref()), grid);
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::qwen3_next::GATE
        .tiny(9)
        .write(dir.path())
        .expect("write");
    let model = load(dir.path());
    check(&model, "hybrid plain", None, grid);
}

#[test]
fn short_prefixes_other_tenants_and_cancelled_leaders_leave_requests_to_prefill_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write");
    let model = load(dir.path());
    let one = turn([3, 5, 6, 2]);
    // Three tokens in common of seventeen to prefill: not worth a wait.
    let mut other = one.clone();
    other[3..].iter_mut().for_each(|t| *t += 1);
    let (outputs, waiting) = together(
        &model,
        None,
        vec![request(&one, None), request(&other, None)],
        4,
    );
    assert_eq!(waiting, 0, "short prefix");
    assert_eq!(outputs[1].cached_tokens, 0, "short prefix");
    assert_same("short prefix", &outputs[1], &cold(&model, None, &other));
    // Another tenant never waits for, nor starts from, this one's prompt.
    let tenant = |t: &str| Request {
        tenant: Some(t.into()),
        ..request(&one, None)
    };
    let (outputs, waiting) = together(&model, None, vec![tenant("a"), tenant("b")], 4);
    assert_eq!(waiting, 0, "tenants");
    assert_eq!(
        (outputs[0].cached_tokens, outputs[1].cached_tokens),
        (0, 0),
        "tenants"
    );
    // A leader cancelled during its prefill: the waiting copy goes on.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let leader = Request {
        cancel: Some(Arc::clone(&stop)),
        ..request(&one, None)
    };
    let mut scheduler = Scheduler::new(&model, schedule(4))
        .expect("scheduler")
        .with_prefix_cache(PrefixCacheConfig::default());
    let first = scheduler
        .submit(leader, |_| ControlFlow::Continue(()))
        .expect("submit");
    let copy = scheduler
        .submit(request(&one, None), |_| ControlFlow::Continue(()))
        .expect("submit");
    let mut done = scheduler.step().finished;
    assert_eq!(scheduler.queued(), 1, "the copy waits");
    flag.store(true, Ordering::Relaxed);
    let mut steps = 0;
    while !scheduler.is_idle() {
        steps += 1;
        assert!(steps < 100, "the copy never ended");
        done.extend(scheduler.step().finished);
    }
    let result = |id| {
        done.iter()
            .find(|f| f.id == id)
            .and_then(|f| f.result.as_ref().ok())
            .expect("finished")
    };
    assert_eq!(result(first).finish, serve_loop::Finish::Cancelled);
    assert_same(
        "after a cancelled leader",
        result(copy),
        &cold(&model, None, &one),
    );
}

/// A queued request waiting for a prefix keeps its place in the queue and
/// in the batch: one behind it that shares nothing takes a free place
/// beside it (a batch of 3), never its own (a batch of 2: it waits).
#[test]
fn a_waiting_request_keeps_its_place_and_lets_others_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write");
    let model = load(dir.path());
    let one = turn([3, 5, 6, 2]);
    let other: Vec<u32> = one.iter().map(|t| t + 20).collect();
    for (max_batch, queued) in [(3, 1), (2, 2)] {
        let requests = vec![
            request(&one, None),
            request(&one, None),
            request(&other, None),
        ];
        let (outputs, waiting) = together(&model, None, requests, max_batch);
        assert_eq!(waiting, queued, "batch of {max_batch}: the copy waits");
        assert_eq!(
            outputs.iter().map(|o| o.cached_tokens).collect::<Vec<_>>(),
            [0, one.len() - 1, 0]
        );
        assert_same("copy", &outputs[1], &cold(&model, None, &one));
        assert_same("other", &outputs[2], &cold(&model, None, &other));
    }
}
