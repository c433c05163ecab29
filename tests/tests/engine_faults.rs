//! The engine facade under faults and load: a drafter failing mid-round
//! fails only its request, naming the provider; providers built for
//! requests' own options are kept (bounded) and give plain greedy output;
//! a soak of 1,000 requests from several threads, mixed providers, some
//! cancelled, loses none and leaves MLX active memory where it started.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mlx_rs::Array;
use serve_loop::{
    Engine, EngineConfig, Event, Finish, Loaded, ProviderChoice, ProviderFactory, Request,
    ScheduleConfig, ServeError, SpecConfig,
};
use spec_core::{
    BoxError, CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, ProviderOptions,
    Sampler, SpecError, Target,
};
use spec_models::{load_model, LoadOptions};

use draft_prompt_lookup as _;

/// Drafts the last token again; its `k`-th draft fails (or panics).
struct Faulty {
    id: &'static str,
    fail_at: usize,
    panics: bool,
}

struct FaultySource {
    fail_at: usize,
    panics: bool,
    drafts: usize,
}

impl DraftSource for FaultySource {
    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.drafts += 1;
        if self.drafts == self.fail_at {
            if self.panics {
                panic!("injected draft panic");
            }
            return Err(SpecError::Model("injected draft failure".into()));
        }
        let last = request.history.last().copied().unwrap_or(0);
        Ok(Draft {
            tokens: vec![last; request.max_tokens.min(2)],
            probs: None,
        })
    }
    fn commit(&mut self, _info: CommitInfo<'_>) -> Result<(), SpecError> {
        Ok(())
    }
}

impl DraftProvider for Faulty {
    fn id(&self) -> &str {
        self.id
    }
    fn open<'a>(&self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(FaultySource {
            fail_at: self.fail_at,
            panics: self.panics,
            drafts: 0,
        }))
    }
}

/// Loads the tiny model with `prompt-lookup`, `faulty` (failing at its
/// third draft) and `panicky` (panicking at its second), and a factory that builds `prompt-lookup` for options
/// (counting its builds) and refuses `refuse`.
fn start(dir: &Path, max_batch: usize, built_providers: usize, builds: Arc<AtomicUsize>) -> Engine {
    let dir = dir.to_path_buf();
    let config = EngineConfig {
        schedule: ScheduleConfig {
            max_batch,
            ..ScheduleConfig::default()
        },
        max_queue: 2_000,
        built_providers,
        ..EngineConfig::default()
    };
    Engine::start(config, move || {
        let target = load_model(&dir, &LoadOptions::default())?;
        let lookup = serve_loop::build_provider("prompt-lookup", &target, &ProviderOptions::new())?;
        let factory: ProviderFactory = Box::new(move |id, target, options| {
            if id == "refuse" {
                return Err::<_, BoxError>("no such builder".into());
            }
            builds.fetch_add(1, Ordering::SeqCst);
            Ok(serve_loop::build_provider(id, target, options)?)
        });
        Ok(Loaded {
            target: Box::new(target),
            providers: vec![
                lookup,
                Box::new(Faulty {
                    id: "faulty",
                    fail_at: 3,
                    panics: false,
                }),
                Box::new(Faulty {
                    id: "panicky",
                    fail_at: 2,
                    panics: true,
                }),
            ],
            factory: Some(factory),
            prefix_store: None,
        })
    })
    .expect("engine")
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed * 17 + (i % 5) * 13 + i / 5) % 96)
        .collect()
}

fn request(
    prompt: Vec<u32>,
    max_tokens: usize,
    provider: Option<(&str, ProviderOptions)>,
) -> Request {
    Request {
        speculation: provider.map(|(id, options)| ProviderChoice {
            id: id.into(),
            config: SpecConfig::default(),
            options,
        }),
        ..Request::new(prompt, max_tokens)
    }
}

fn tokens(engine: &Engine, r: Request) -> Result<Vec<u32>, ServeError> {
    engine.submit(r)?.wait().map(|done| done.output.tokens)
}

fn options(n: usize) -> ProviderOptions {
    ProviderOptions::from([("max_ngram", n.to_string().as_str())])
}

fn tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 5).expect("write model");
    dir
}

#[test]
fn a_failing_drafter_fails_only_its_request_naming_the_provider() {
    let dir = tiny();
    let engine = start(dir.path(), 4, 2, Arc::default());
    let asks = || {
        vec![
            request(prompt(1, 9), 24, None),
            request(
                prompt(2, 14),
                24,
                Some(("prompt-lookup", ProviderOptions::new())),
            ),
            request(prompt(3, 11), 24, Some(("faulty", ProviderOptions::new()))),
            request(prompt(4, 7), 24, Some(("prompt-lookup", options(2)))),
        ]
    };
    let plain: Vec<Vec<u32>> = [(1, 9), (2, 14), (3, 11), (4, 7)]
        .iter()
        .map(|&(s, n)| tokens(&engine, request(prompt(s, n), 24, None)).expect("plain"))
        .collect();
    let handles: Vec<_> = asks()
        .into_iter()
        .map(|r| engine.submit(r).expect("submitted"))
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.wait()).collect();
    for (i, (result, plain)) in results.iter().zip(&plain).enumerate() {
        if i == 2 {
            let err = result
                .as_ref()
                .expect_err("the faulty drafter's request fails");
            let message = spec_core::error::report(err);
            assert!(message.contains("`faulty`"), "{message}");
            assert!(message.contains("injected draft failure"), "{message}");
        } else {
            let done = result.as_ref().expect("the others finish");
            assert_eq!(&done.output.tokens, plain, "request {i}");
        }
    }
    let refused = tokens(
        &engine,
        request(prompt(5, 6), 4, Some(("refuse", options(3)))),
    );
    let message = spec_core::error::report(&refused.expect_err("the factory refuses"));
    assert!(
        message.contains("`refuse`") && message.contains("no such builder"),
        "{message}"
    );
    assert_eq!(engine.held(), 0);
    engine.shutdown().expect("shutdown");
}

/// A panic on the engine thread ends the requests it held, is kept for
/// `Engine::failure` (a host's health check and exit read it), and every
/// later submission fails naming it: the engine never lingers half alive.
#[test]
fn a_panic_on_the_engine_thread_is_reported_not_hidden() {
    let dir = tiny();
    let engine = start(dir.path(), 4, 2, Arc::default());
    assert_eq!(engine.failure(), None);
    let plain = tokens(&engine, request(prompt(1, 9), 8, None)).expect("plain");
    assert_eq!(plain.len(), 8);
    let beside = engine
        .submit(request(prompt(2, 14), 400, None))
        .expect("submitted");
    let panics = tokens(
        &engine,
        request(prompt(3, 11), 24, Some(("panicky", ProviderOptions::new()))),
    );
    assert!(panics.is_err(), "the panicking request cannot succeed");
    assert!(beside.wait().is_err(), "the request beside it ends too");
    // The failure is recorded once the thread has unwound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine.failure().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let failure = engine.failure().expect("the panic is recorded");
    assert!(failure.contains("injected draft panic"), "{failure}");
    match engine.submit(request(prompt(4, 7), 4, None)) {
        Err(ServeError::Panicked(message)) => assert_eq!(message, failure),
        other => panic!("a submission after the panic: {other:?}"),
    }
    engine
        .shutdown()
        .expect("the thread ended without a second panic");
}

#[test]
fn built_providers_are_kept_per_options_and_bounded() {
    let dir = tiny();
    let builds = Arc::new(AtomicUsize::new(0));
    let engine = start(dir.path(), 4, 2, Arc::clone(&builds));
    let plain = tokens(&engine, request(prompt(6, 12), 16, None)).expect("plain");
    let with = |n| {
        tokens(
            &engine,
            request(prompt(6, 12), 16, Some(("prompt-lookup", options(n)))),
        )
    };
    assert_eq!(with(2).expect("built"), plain);
    assert_eq!(with(2).expect("kept"), plain);
    assert_eq!(
        builds.load(Ordering::SeqCst),
        1,
        "the same options reuse it"
    );
    // Three option sets at once with two slots: each builds as it comes,
    // the least recently used making room while its requests run on.
    let handles: Vec<_> = [3, 4, 5, 2]
        .into_iter()
        .map(|n| {
            engine
                .submit(request(
                    prompt(6, 12),
                    16,
                    Some(("prompt-lookup", options(n))),
                ))
                .expect("submitted")
        })
        .collect();
    for h in handles {
        assert_eq!(h.wait().expect("done").output.tokens, plain);
    }
    assert!(builds.load(Ordering::SeqCst) >= 4);
    assert_eq!(engine.held(), 0);
    engine.shutdown().expect("shutdown");
}

/// The live-server case of the structure issue: one long request runs on a
/// built provider, five requests each need a provider built for new options
/// (more than the set keeps), then a one-token plain request comes. Nothing
/// waits for the long request to end: the short one is done within a few
/// steps of its submission (counted from after `submit` returned, so a
/// slow test thread can only lower the count), and every answer is its
/// plain one. Before, the short request waited for all of the long one's
/// steps (at least 2,000 / 17 of them).
#[test]
fn a_provider_build_never_stalls_admission() {
    const LONG: usize = 2000;
    let dir = tiny();
    let builds = Arc::new(AtomicUsize::new(0));
    let engine = start(dir.path(), 8, 4, Arc::clone(&builds));
    let long_plain = tokens(&engine, request(prompt(7, 10), LONG, None)).expect("plain");
    let short_plain = tokens(&engine, request(prompt(8, 6), 1, None)).expect("plain");
    let long = engine
        .submit(request(
            prompt(7, 10),
            LONG,
            Some(("prompt-lookup", options(2))),
        ))
        .expect("long");
    let others: Vec<_> = (3..8)
        .map(|n| {
            engine
                .submit(request(
                    prompt(6, 12),
                    8,
                    Some(("prompt-lookup", options(n))),
                ))
                .expect("submitted")
        })
        .collect();
    let short = engine
        .submit(request(prompt(8, 6), 1, None))
        .expect("short");
    let before = engine.stats().steps;
    let short = short.wait().expect("short done");
    let after = engine.stats().steps;
    assert_eq!(short.output.tokens, short_plain);
    // The six builds and the other requests' prefills share those steps.
    assert!(
        after - before <= 8,
        "the one-token request took {} steps",
        after - before
    );
    for h in others {
        assert_eq!(h.wait().expect("done").output.tokens.len(), 8);
    }
    long.cancel();
    let long = long.wait().expect("long done");
    assert!(
        long_plain.starts_with(&long.output.tokens),
        "the long request's tokens are its plain ones"
    );
    assert_eq!(
        builds.load(Ordering::SeqCst),
        6,
        "each option set built once"
    );
    assert_eq!(engine.held(), 0);
    engine.shutdown().expect("shutdown");
}

#[test]
fn a_soak_of_1000_requests_loses_none_and_returns_memory() {
    const SUBMITTERS: usize = 4;
    const PER_SUBMITTER: usize = 250;
    let dir = tiny();
    let engine = start(dir.path(), 8, 3, Arc::default());
    // Warm up every path once, so that what stays allocated is the model.
    for provider in [
        None,
        Some(("prompt-lookup", ProviderOptions::new())),
        Some(("prompt-lookup", options(2))),
    ] {
        tokens(&engine, request(prompt(0, 8), 8, provider)).expect("warm-up");
    }
    let start_memory = mlx_rs::memory::active_memory().expect("active memory");
    let ends: Vec<BTreeMap<&'static str, usize>> = std::thread::scope(|scope| {
        let engine = &engine;
        let threads: Vec<_> = (0..SUBMITTERS)
            .map(|t| {
                scope.spawn(move || {
                    let mut ends = BTreeMap::new();
                    let mut handles = Vec::new();
                    for k in 0..PER_SUBMITTER {
                        let i = t * PER_SUBMITTER + k;
                        let provider = match i % 5 {
                            0 => None,
                            1 | 2 => Some(("prompt-lookup", ProviderOptions::new())),
                            3 => Some(("prompt-lookup", options(2 + i % 4))),
                            _ => Some(("faulty", ProviderOptions::new())),
                        };
                        let r = request(prompt(i as u32, 3 + i % 13), 2 + i % 11, provider);
                        let handle = engine.submit(r).expect("within the queue");
                        if i.is_multiple_of(7) {
                            handle.cancel();
                        }
                        handles.push(handle);
                    }
                    for handle in handles {
                        let mut streamed = 0;
                        let mut end = "lost";
                        for event in handle {
                            match event {
                                Event::Token { .. } => streamed += 1,
                                Event::Done(done) => {
                                    assert_eq!(done.output.tokens.len(), streamed);
                                    end = if done.output.finish == Finish::Cancelled {
                                        "cancelled"
                                    } else {
                                        "done"
                                    };
                                }
                                Event::Failed(ServeError::Stopped) => end = "stopped",
                                Event::Failed(e) => {
                                    let message = spec_core::error::report(&e);
                                    assert!(message.contains("`faulty`"), "{message}");
                                    end = "failed";
                                }
                            }
                        }
                        *ends.entry(end).or_insert(0) += 1;
                    }
                    ends
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a submitter"))
            .collect()
    });
    let mut total: BTreeMap<&str, usize> = BTreeMap::new();
    for (end, n) in ends.iter().flatten() {
        *total.entry(end).or_insert(0) += n;
    }
    assert_eq!(total.values().sum::<usize>(), SUBMITTERS * PER_SUBMITTER);
    assert_eq!(
        total.keys().copied().collect::<Vec<_>>(),
        ["cancelled", "done", "failed"],
        "every request ends with a result or a clear error: {total:?}"
    );
    assert_eq!(engine.held(), 0);
    let stats = engine.stats();
    assert_eq!(
        stats.completed + stats.failed,
        (SUBMITTERS * PER_SUBMITTER + 3) as u64
    );
    assert!(
        stats.rows_per_step.len() > 2,
        "rows shared steps: {:?}",
        stats.rows_per_step
    );
    // What the prefix cache holds (it outlives every request, up to its
    // budget) is counted in its bytes; nothing else may stay.
    let end_memory = mlx_rs::memory::active_memory().expect("active memory");
    let cached = stats.prefix_cache.bytes;
    assert!(
        end_memory <= start_memory + cached + (64 << 10),
        "MLX active memory {start_memory} -> {end_memory} bytes ({cached} in the prefix cache)"
    );
    engine.shutdown().expect("shutdown");
}
