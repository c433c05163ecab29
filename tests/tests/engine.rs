//! The engine facade: requests submitted from several threads stream the
//! tokens they give alone; cancellation, a full engine, an unknown
//! provider and shutdown answer as documented.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serve_loop::{
    Engine, EngineConfig, Event, Finish, Loaded, PrefixCacheConfig, ProviderChoice, Request,
    ScheduleConfig, ServeError, SpecConfig,
};
use spec_core::{BoxError, DraftProvider, ProviderOptions, SamplerConfig};
use spec_models::{load_model, LoadOptions};

use draft_prompt_lookup as _;

fn loader(dir: &Path) -> impl FnOnce() -> Result<Loaded, BoxError> + Send + 'static {
    let dir = dir.to_path_buf();
    move || {
        let target = load_model(&dir, &LoadOptions::default())?;
        let lookup = serve_loop::build_provider("prompt-lookup", &target, &ProviderOptions::new())?;
        Ok(Loaded {
            target: Box::new(target),
            providers: vec![lookup],
            factory: None,
            prefix_store: None,
        })
    }
}

fn engine(dir: &Path, max_batch: usize, max_queue: usize) -> Engine {
    let config = EngineConfig {
        schedule: ScheduleConfig {
            max_batch,
            ..ScheduleConfig::default()
        },
        max_queue,
        ..EngineConfig::default()
    };
    Engine::start(config, loader(dir)).expect("engine")
}

/// What one submission asks for.
#[derive(Clone)]
struct Ask {
    prompt: Vec<u32>,
    max_tokens: usize,
    lookup: bool,
    temperature: f32,
    seed: u64,
}

impl Ask {
    fn request(&self) -> Request {
        Request {
            sampler: SamplerConfig {
                temperature: self.temperature,
                seed: self.seed,
                ..SamplerConfig::default()
            },
            speculation: self.lookup.then(|| ProviderChoice {
                id: "prompt-lookup".into(),
                config: SpecConfig::default(),
                options: ProviderOptions::new(),
            }),
            ..Request::new(self.prompt.clone(), self.max_tokens)
        }
    }

    /// The same request through `generate`, alone.
    fn alone(&self, dir: &Path) -> (Vec<u32>, Vec<f32>) {
        let model = load_model(dir, &LoadOptions::default()).expect("load");
        let lookup = serve_loop::build_provider("prompt-lookup", &model, &ProviderOptions::new())
            .expect("provider");
        let provider: &dyn DraftProvider = lookup.as_ref();
        let out = serve_loop::generate(&model, &[provider], self.request(), |_| {
            ControlFlow::Continue(())
        })
        .expect("generate");
        (out.tokens, out.logprobs)
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed * 17 + (i % 5) * 13 + i / 5) % 96)
        .collect()
}

#[test]
fn requests_from_several_threads_stream_what_they_give_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 11).expect("write model");
    let engine = engine(dir.path(), 3, 8);
    let asks: Vec<Ask> = (0..5u32)
        .map(|i| Ask {
            prompt: prompt(i, 6 + 5 * i as usize),
            max_tokens: 12 + 3 * i as usize,
            lookup: i % 2 == 0,
            temperature: if i == 3 { 0.7 } else { 0.0 },
            seed: u64::from(i),
        })
        .collect();
    let streamed: Vec<(Vec<u32>, Vec<f32>, Finish)> = std::thread::scope(|scope| {
        let engine = &engine;
        let threads: Vec<_> = asks
            .iter()
            .map(|ask| {
                scope.spawn(move || {
                    let handle = engine.submit(ask.request()).expect("submit");
                    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
                    for event in handle {
                        match event {
                            Event::Token { token, logprob, .. } => {
                                tokens.push(token);
                                logprobs.push(logprob);
                            }
                            Event::Done(done) => {
                                assert_eq!(done.output.tokens, tokens, "streamed = output");
                                assert!(done.first_token_seconds.is_some());
                                return (tokens, logprobs, done.output.finish);
                            }
                            Event::Failed(e) => panic!("failed: {e}"),
                        }
                    }
                    panic!("the stream ended without an end event")
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect()
    });
    for (ask, (tokens, logprobs, finish)) in asks.iter().zip(&streamed) {
        let (want, want_lp) = ask.alone(dir.path());
        assert_eq!(tokens, &want);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(logprobs), bits(&want_lp));
        assert_eq!(*finish, Finish::MaxTokens);
    }
    let stats = engine.stats();
    assert_eq!(stats.completed, 5);
    assert_eq!(stats.rows_per_step.iter().sum::<u64>(), stats.steps);
    assert!(
        stats.rows_per_step.len() <= 4,
        "never more than max_batch rows"
    );
    // The lookup rows size their drafts with the goodput policy (the
    // default), whose step cost model learned from the decoding steps.
    assert!(stats.step_cost.samples > 0, "{:?}", stats.step_cost);
    engine.shutdown().expect("shutdown");
}

/// A lone plain request decodes pipelined through the engine (the path
/// `generate` takes alone) with `generate`'s tokens and log-probabilities;
/// a request that arrives while it runs joins at the next step, and both
/// stream what they give alone.
#[test]
fn a_lone_plain_request_decodes_pipelined_and_a_newcomer_joins_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 5).expect("write model");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let engine = engine(dir.path(), 4, 4);
    let lone = Ask {
        prompt: prompt(2, 9),
        max_tokens: 40,
        lookup: false,
        temperature: 0.0,
        seed: 0,
    };
    let done = engine
        .submit(lone.request())
        .expect("submit")
        .wait()
        .expect("lone");
    let (want, want_lp) = lone.alone(dir.path());
    assert_eq!(done.output.tokens, want);
    assert_eq!(bits(&done.output.logprobs), bits(&want_lp));
    let stats = engine.stats();
    // A prompt step, the first token's step, then one pipelined forward per
    // further token.
    assert_eq!((stats.steps, stats.lone_steps), (41, 39), "{stats:?}");
    assert_eq!(stats.rows_per_step.iter().sum::<u64>(), stats.steps);

    // The first request holds its 10th token on the engine thread until the
    // second is submitted, so the second arrives mid-way.
    let first = Ask {
        prompt: prompt(4, 11),
        max_tokens: 60,
        temperature: 0.8,
        seed: 3,
        ..lone.clone()
    };
    let second = Ask {
        prompt: prompt(6, 7),
        max_tokens: 20,
        ..lone.clone()
    };
    let (at_ten, reached) = std::sync::mpsc::channel::<()>();
    let (go, resume) = std::sync::mpsc::channel::<()>();
    let mut seen = 0;
    let hook = move |_: &serve_loop::Emitted<'_>| {
        seen += 1;
        if seen == 10 {
            at_ten.send(()).expect("the test waits");
            resume.recv().expect("the test resumes");
        }
        ControlFlow::Continue(())
    };
    let a = engine
        .submit(Request {
            on_token: Some(Box::new(hook)),
            ..first.request()
        })
        .expect("submit");
    reached
        .recv()
        .expect("the first request reached its 10th token");
    let b = engine.submit(second.request()).expect("submit");
    go.send(()).expect("resume");
    let (a, b) = (a.wait().expect("first"), b.wait().expect("second"));
    for (ask, done) in [(&first, &a), (&second, &b)] {
        let (want, want_lp) = ask.alone(dir.path());
        assert_eq!(done.output.tokens, want);
        assert_eq!(bits(&done.output.logprobs), bits(&want_lp));
    }
    let after = engine.stats();
    // Every step of the second request (its prompt, 20 tokens) had the
    // first one's row beside it; the first decoded pipelined before the
    // second came (tokens 2 to 11) and after it left.
    assert!(
        after.rows_per_step.get(2).copied().unwrap_or(0) >= 21,
        "{after:?}"
    );
    assert!(after.lone_steps - stats.lone_steps > 10, "{after:?}");
    assert_eq!(after.rows_per_step.iter().sum::<u64>(), after.steps);
    engine.shutdown().expect("shutdown");
}

/// Plain requests decoding together run pipelined (each step's packed
/// forward queued on the previous step's lazy tokens): greedy and sampled
/// rows, rows ending by max tokens at different steps and one stopped by
/// its token hook stream what they give alone, bit for bit.
#[test]
fn plain_requests_together_decode_pipelined_with_their_tokens_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 13).expect("write model");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let engine = engine(dir.path(), 4, 4);
    let asks: Vec<Ask> = (0..4u32)
        .map(|i| Ask {
            prompt: prompt(i + 1, 5 + 3 * i as usize),
            max_tokens: 18 + 7 * i as usize,
            lookup: false,
            temperature: if i % 2 == 1 { 0.8 } else { 0.0 },
            seed: u64::from(i) + 5,
        })
        .collect();
    // Request 2 stops itself at its 9th token.
    let handles: Vec<_> = asks
        .iter()
        .enumerate()
        .map(|(i, ask)| {
            let mut seen = 0;
            let request = Request {
                on_token: (i == 2).then(|| {
                    Box::new(move |_: &serve_loop::Emitted<'_>| {
                        seen += 1;
                        if seen == 9 {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    }) as serve_loop::OwnHook
                }),
                ..ask.request()
            };
            engine.submit(request).expect("submit")
        })
        .collect();
    for (i, (ask, handle)) in asks.iter().zip(handles).enumerate() {
        let done = handle.wait().expect("request");
        let (want, want_lp) = ask.alone(dir.path());
        let n = if i == 2 { 9 } else { want.len() };
        assert_eq!(done.output.tokens, want[..n], "request {i}");
        assert_eq!(
            bits(&done.output.logprobs),
            bits(&want_lp[..n]),
            "request {i}"
        );
        let finish = if i == 2 {
            Finish::Stopped
        } else {
            Finish::MaxTokens
        };
        assert_eq!(done.output.finish, finish, "request {i}");
    }
    let stats = engine.stats();
    assert!(stats.pipelined_steps > 10, "{stats:?}");
    assert_eq!(stats.rows_per_step.iter().sum::<u64>(), stats.steps);
    engine.shutdown().expect("shutdown");
}

#[test]
fn cancel_full_engine_unknown_provider_and_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 11).expect("write model");
    let engine = engine(dir.path(), 1, 1);
    let long = Ask {
        prompt: prompt(1, 8),
        max_tokens: 100_000,
        lookup: false,
        temperature: 0.0,
        seed: 0,
    };
    let mut handle = engine.submit(long.request()).expect("submit");
    // The handle cancels through a flag the request brings.
    let own = Arc::new(AtomicBool::new(false));
    let queued = engine
        .submit(Request {
            cancel: Some(Arc::clone(&own)),
            ..long.request()
        })
        .expect("submit");
    assert!(Arc::ptr_eq(&queued.cancel_flag(), &own));
    match engine.submit(long.request()) {
        Err(ServeError::Busy { limit: 2 }) => {}
        other => panic!("expected a full engine, got {other:?}"),
    }
    // A cancelled request leaves the queue without waiting for a place.
    own.store(true, Ordering::Relaxed);
    let done = queued.wait().expect("ended");
    assert_eq!(done.output.finish, Finish::Cancelled);
    assert!(done.output.tokens.is_empty());
    // Cancel after three tokens: the request ends within a step.
    let flag = handle.cancel_flag();
    let mut tokens = Vec::new();
    for event in handle.by_ref() {
        match event {
            Event::Token { token, .. } => {
                tokens.push(token);
                if tokens.len() == 3 {
                    // From another thread, as a host would.
                    let flag = flag.clone();
                    std::thread::spawn(move || flag.store(true, Ordering::Relaxed))
                        .join()
                        .expect("thread");
                }
            }
            Event::Done(done) => {
                assert_eq!(done.output.finish, Finish::Cancelled);
                assert_eq!(done.output.tokens, tokens);
                break;
            }
            Event::Failed(e) => panic!("failed: {e}"),
        }
    }
    assert!(tokens.len() >= 3 && tokens.len() < 100_000);
    assert!(
        handle.next().is_none(),
        "the stream ends after its end event"
    );
    let want = Ask {
        max_tokens: tokens.len(),
        ..long.clone()
    }
    .alone(dir.path())
    .0;
    assert_eq!(tokens, want);

    let unknown = Request {
        speculation: Some(ProviderChoice {
            id: "no-such".into(),
            config: SpecConfig::default(),
            options: ProviderOptions::new(),
        }),
        ..Request::new(vec![1, 2, 3], 4)
    };
    match engine.submit(unknown).expect("submit").wait() {
        Err(ServeError::NoSuchProvider { id, loaded }) => {
            assert_eq!((id.as_str(), loaded.as_str()), ("no-such", "prompt-lookup"));
        }
        other => panic!("expected an unknown provider, got {other:?}"),
    }
    match engine
        .submit(Request::new(Vec::new(), 4))
        .expect("submit")
        .wait()
    {
        Err(ServeError::EmptyPrompt) => {}
        other => panic!("expected an empty prompt error, got {other:?}"),
    }
    // Shutdown ends what is still running as cancelled.
    let running = engine.submit(long.request()).expect("submit");
    engine.shutdown().expect("shutdown");
    let done = running.wait().expect("ended");
    assert_eq!(done.output.finish, Finish::Cancelled);

    let failed = Engine::start(EngineConfig::default(), || Err("no model here".into()));
    assert!(matches!(failed, Err(ServeError::Load(_))), "{failed:?}");
}

/// A chat's next turn through the engine: the second request starts from
/// the first one's cached prefill (`cached_tokens`, the engine's counters)
/// and streams what it streams with the cache off.
#[test]
fn a_next_turn_reuses_the_prefix_cache_and_streams_the_same_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write");
    let schedule = ScheduleConfig {
        prefill_chunk: 8,
        ..ScheduleConfig::default()
    };
    let run = |cache: PrefixCacheConfig, lookup: bool| {
        let config = EngineConfig {
            schedule: schedule.clone(),
            prefix_cache: cache,
            ..EngineConfig::default()
        };
        let engine = Engine::start(config, loader(dir.path())).expect("engine");
        let first = Ask {
            prompt: prompt(3, 21),
            max_tokens: 6,
            lookup,
            temperature: 0.0,
            seed: 0,
        };
        let a = engine
            .submit(first.request())
            .expect("submit")
            .wait()
            .expect("A");
        let mut next = first.prompt.clone();
        next.extend(&a.output.tokens);
        next.extend(prompt(5, 7));
        let second = Ask {
            prompt: next,
            ..first
        };
        let b = engine
            .submit(second.request())
            .expect("submit")
            .wait()
            .expect("B");
        let stats = engine.stats();
        engine.shutdown().expect("shutdown");
        (a, b, stats)
    };
    for lookup in [false, true] {
        let (a, b, stats) = run(PrefixCacheConfig::default(), lookup);
        let (_, cold, off) = run(PrefixCacheConfig::off(), lookup);
        // The tiny llama is split-invariant: A left its 21-token prompt and
        // its answer (but the last token when it never ran).
        let at = b.output.cached_tokens;
        let all = 21 + a.output.tokens.len();
        assert!(at == all || at == all - 1, "B starts at {at} of {all}");
        assert_eq!(a.output.cached_tokens, 0);
        assert_eq!(cold.output.cached_tokens, 0);
        assert_eq!(b.output.tokens, cold.output.tokens, "lookup {lookup}");
        let bits = |c: &serve_loop::Completion| -> Vec<u32> {
            c.output.logprobs.iter().map(|l| l.to_bits()).collect()
        };
        assert_eq!(bits(&b), bits(&cold), "lookup {lookup}");
        let p = stats.prefix_cache;
        assert_eq!(
            (p.hits, p.misses, p.cached_tokens),
            (1, 1, at as u64),
            "{p:?}"
        );
        assert!(p.entries >= 1 && p.bytes > 0, "{p:?}");
        assert_eq!(off.prefix_cache, Default::default());
    }
}
