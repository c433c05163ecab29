//! The serve loop's contract on a real (tiny, random) model: full and
//! tail-split prefill, exact max tokens with drafts in flight, cancellation,
//! speculation past a rotated sliding window, logits processors at every verified
//! position, and lossless rejection sampling end to end.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlx_rs::Array;
use serve_loop::{
    AdaptiveConfig, Finish, Output, ProviderChoice, Request, ServeError, SpecConfig, VerifyMode,
};
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, LogitsProcessor, PrefillMode,
    RepetitionPenalty, Sampler, SamplerConfig, SpecError, Target,
};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, LoadOptions};

fn model_with(window: Option<usize>) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama_with(dir.path(), 11, window).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

/// Proposes a fixed continuation (the plain output), optionally corrupted
/// every third token so rounds end in rejections too.
#[derive(Clone)]
struct Oracle {
    reference: Vec<u32>,
    prompt_len: usize,
    mode: PrefillMode,
    corrupt: bool,
}

struct OracleSource(Oracle);

impl DraftSource for OracleSource {
    fn prefill_mode(&self) -> PrefillMode {
        self.0.mode
    }
    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let done = request.history.len() - self.0.prompt_len;
        let tokens = self
            .0
            .reference
            .iter()
            .enumerate()
            .skip(done)
            .take(request.max_tokens)
            .map(|(i, &t)| {
                if self.0.corrupt && i % 3 == 2 {
                    (t + 1) % 96
                } else {
                    t
                }
            })
            .collect();
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, _info: CommitInfo<'_>) -> Result<(), SpecError> {
        Ok(())
    }
}

impl DraftProvider for Oracle {
    fn id(&self) -> &str {
        "oracle"
    }
    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(OracleSource(self.clone())))
    }
}

/// The oracle in optiq's round shape: every round drafts the full length,
/// also when fewer tokens remain to emit.
struct FullRounds(Oracle);

struct FullRoundsSource(OracleSource);

impl DraftSource for FullRoundsSource {
    fn prefill_mode(&self) -> PrefillMode {
        self.0.prefill_mode()
    }
    fn drafts_past_max_tokens(&self) -> bool {
        true
    }
    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        self.0.prefill(prompt, taps)
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.0.draft(request, sampler)
    }
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.0.commit(info)
    }
}

impl DraftProvider for FullRounds {
    fn id(&self) -> &str {
        "full-rounds"
    }
    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(FullRoundsSource(OracleSource(self.0.clone()))))
    }
}

struct Run<'a> {
    prompt: &'a [u32],
    max_tokens: usize,
    provider: Option<&'a dyn DraftProvider>,
    sampler: SamplerConfig,
    processors: Vec<Box<dyn LogitsProcessor + Send>>,
    verify: VerifyMode,
    cancel: Option<Arc<AtomicBool>>,
    seed: u64,
    num_draft: usize,
    adaptive: AdaptiveConfig,
}

impl<'a> Run<'a> {
    fn new(prompt: &'a [u32], max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            provider: None,
            sampler: SamplerConfig::default(),
            processors: Vec::new(),
            verify: VerifyMode::ExactMatch,
            cancel: None,
            seed: 0,
            num_draft: 3,
            adaptive: AdaptiveConfig::off(),
        }
    }
    fn go(self, target: &dyn Target, on_token: impl FnMut(u32) -> ControlFlow<()>) -> Output {
        let config = SpecConfig {
            num_draft: self.num_draft,
            verify: self.verify,
            adaptive: self.adaptive.clone(),
            seed: self.seed,
        };
        let request = Request {
            sampler: self.sampler,
            processors: self.processors,
            speculation: self
                .provider
                .map(|provider| ProviderChoice::new(provider.id(), config)),
            cancel: self.cancel,
            ..Request::new(self.prompt.to_vec(), self.max_tokens)
        };
        let providers = self.provider.as_slice();
        serve_loop::generate(target, providers, request, on_token).expect("generate")
    }
}

fn go(target: &dyn Target, run: Run<'_>) -> Output {
    run.go(target, |_| ControlFlow::Continue(()))
}

const PROMPT: &[u32] = &[7, 3, 50, 21, 8, 8, 64, 2, 19];

#[test]
fn full_and_tail_split_prefill_give_plain_output() {
    let (_d, model) = model_with(None);
    let plain = go(&model, Run::new(PROMPT, 30)).tokens;
    for mode in [PrefillMode::TailSplit, PrefillMode::Full] {
        for corrupt in [false, true] {
            let oracle = Oracle {
                reference: plain.clone(),
                prompt_len: PROMPT.len(),
                mode,
                corrupt,
            };
            let out = go(
                &model,
                Run {
                    provider: Some(&oracle),
                    ..Run::new(PROMPT, 30)
                },
            );
            assert_eq!(out.tokens, plain, "{mode:?} corrupt={corrupt}");
            assert!(
                out.stats.accepted > 0 && out.stats.target_calls < 30,
                "{mode:?}: {:?}",
                out.stats
            );
            if corrupt {
                assert!(out.stats.rejected > 0);
            }
        }
    }
}

#[test]
fn logprobs_are_reported_for_every_token_and_agree_with_plain_decoding() {
    let (_d, model) = model_with(None);
    let plain = go(&model, Run::new(PROMPT, 20));
    assert_eq!(plain.logprobs.len(), plain.tokens.len());
    assert!(
        plain.logprobs.iter().all(|&lp| lp <= 0.0 && lp.is_finite()),
        "{:?}",
        plain.logprobs
    );
    let oracle = Oracle {
        reference: plain.tokens.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: true,
    };
    let spec = go(
        &model,
        Run {
            provider: Some(&oracle),
            ..Run::new(PROMPT, 20)
        },
    );
    assert_eq!(spec.tokens, plain.tokens);
    for (a, b) in plain.logprobs.iter().zip(&spec.logprobs) {
        // The verify window's batched matmuls may round differently.
        assert!((a - b).abs() < 1e-3, "{a} vs {b}");
    }
}

#[test]
fn max_tokens_is_exact_with_drafts_in_flight() {
    let (_d, model) = model_with(None);
    let plain = go(&model, Run::new(PROMPT, 40)).tokens;
    let oracle = Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: false,
    };
    for max in [1, 2, 5, 7, 11] {
        let mut streamed = 0;
        let out = Run {
            provider: Some(&oracle),
            ..Run::new(PROMPT, max)
        }
        .go(&model, |_| {
            streamed += 1;
            ControlFlow::Continue(())
        });
        assert_eq!(out.tokens, plain[..max].to_vec(), "max {max}");
        assert_eq!((streamed, out.finish), (max, Finish::MaxTokens));
    }
}

#[test]
fn adaptive_draft_length_doubles_while_accepted_and_stays_lossless() {
    let (_d, model) = model_with(None);
    let plain = go(&model, Run::new(PROMPT, 60)).tokens;
    let oracle = Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: false,
    };
    let run = |provider: &Oracle| {
        Run {
            provider: Some(provider),
            num_draft: 16,
            adaptive: AdaptiveConfig::default(),
            ..Run::new(PROMPT, 60)
        }
        .go(&model, |_| ControlFlow::Continue(()))
    };
    let out = run(&oracle);
    assert_eq!(out.tokens, plain);
    // Every draft accepted: 3, 6, 12, 16, 16 drafts (4 + 7 + 13 + 17 + 17 =
    // 58 tokens), then the 2 that remain.
    let mut expected = vec![0; 16];
    for len in [3, 6, 12, 16, 16, 2] {
        expected[..len].iter_mut().for_each(|n| *n += 1);
    }
    assert_eq!(out.stats.drafted_by_pos, expected);
    assert_eq!(out.stats.accepted, out.stats.drafted);

    // Every third draft wrong: rounds keep falling back to 3 drafts.
    let corrupted = Oracle {
        corrupt: true,
        ..oracle
    };
    let out = run(&corrupted);
    assert_eq!(out.tokens, plain);
    assert!(
        out.stats.drafted_by_pos.len() <= 6 && out.stats.rejected > 0,
        "{:?}",
        out.stats
    );
}

#[test]
fn full_length_rounds_draft_past_max_tokens_and_emit_exactly_max() {
    let (_d, model) = model_with(None);
    let plain = go(&model, Run::new(PROMPT, 40)).tokens;
    let oracle = || Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::Full,
        corrupt: false,
    };
    let (clamped, full) = (oracle(), FullRounds(oracle()));
    let mut clamped_short = 0;
    for max in [2, 3, 5, 7, 11] {
        let a = go(
            &model,
            Run {
                provider: Some(&clamped),
                ..Run::new(PROMPT, max)
            },
        );
        let b = go(
            &model,
            Run {
                provider: Some(&full),
                ..Run::new(PROMPT, max)
            },
        );
        assert_eq!(a.tokens, plain[..max].to_vec(), "max {max}");
        assert_eq!(b.tokens, plain[..max].to_vec(), "max {max}");
        // Every round of the full-length source drafted 3; the clamped one
        // drafts no more than what remains.
        assert_eq!(
            b.stats.drafted,
            3 * b.stats.acceptance_lengths.len(),
            "max {max}: {:?}",
            b.stats
        );
        assert!(a.stats.drafted <= b.stats.drafted, "max {max}");
        clamped_short += usize::from(a.stats.drafted < b.stats.drafted);
    }
    assert!(clamped_short > 0, "some max ends inside a round");
}

#[test]
fn cancellation_and_host_stops_end_the_request() {
    let (_d, model) = model_with(None);
    let plain = go(&model, Run::new(PROMPT, 40)).tokens;
    let oracle = Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: false,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let out = Run {
        provider: Some(&oracle),
        cancel: Some(Arc::clone(&cancel)),
        ..Run::new(PROMPT, 40)
    }
    .go(&model, |_| {
        cancel.store(true, Ordering::Relaxed);
        ControlFlow::Continue(())
    });
    assert_eq!(out.finish, Finish::Cancelled);
    assert!(
        out.tokens.len() <= 4 && out.tokens[..] == plain[..out.tokens.len()],
        "cancelled within one round"
    );
    let out = Run {
        provider: Some(&oracle),
        ..Run::new(PROMPT, 40)
    }
    .go(&model, |_| ControlFlow::Break(()));
    assert_eq!((out.finish, out.tokens.len()), (Finish::Stopped, 1));
}

/// A request names its provider by id: `generate` refuses one it was not
/// given (naming those it was) and options (it builds no providers).
#[test]
fn a_provider_the_runner_does_not_hold_is_refused() {
    let (_d, model) = model_with(None);
    let oracle = Oracle {
        reference: vec![5; 8],
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: false,
    };
    let ask = |choice: ProviderChoice| {
        let request = Request {
            speculation: Some(choice),
            ..Request::new(PROMPT.to_vec(), 4)
        };
        serve_loop::generate(&model, &[&oracle], request, |_| ControlFlow::Continue(()))
    };
    match ask(ProviderChoice::new("missing", SpecConfig::default())) {
        Err(ServeError::NoSuchProvider { id, loaded }) => {
            assert_eq!((id.as_str(), loaded.as_str()), ("missing", "oracle"));
        }
        other => panic!("expected an unknown provider, got {other:?}"),
    }
    let mut with_options = ProviderChoice::new("oracle", SpecConfig::default());
    with_options.options.insert("k".into(), "v".into());
    assert!(
        matches!(ask(with_options), Err(ServeError::Config(_))),
        "options need a factory"
    );
    let out = ask(ProviderChoice::new("oracle", SpecConfig::default())).expect("held");
    assert_eq!(out.tokens.len(), 4);
}

/// A sliding layer (window 12) keeps speculating once its window has
/// rotated: every round drafts, rejected drafts roll back past the window
/// (`SlidingKvCache`), and the output is plain decoding's; with 16 drafts a
/// round, longer than the window, too.
#[test]
fn a_rotated_sliding_window_keeps_speculating() {
    let (_d, model) = model_with(Some(12));
    let plain = go(&model, Run::new(PROMPT, 30)).tokens;
    let oracle = Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: true,
    };
    for num_draft in [3, 16] {
        let out = go(
            &model,
            Run {
                provider: Some(&oracle),
                num_draft,
                ..Run::new(PROMPT, 30)
            },
        );
        assert_eq!(out.tokens, plain, "{num_draft} drafts");
        let stats = &out.stats;
        assert!(!stats.untrimmable_fallback, "{stats:?}");
        assert!(stats.rejected > 0, "rollbacks past the window: {stats:?}");
        assert_eq!(
            stats.drafted_by_pos.first(),
            Some(&stats.rounds),
            "every round drafted: {stats:?}"
        );
        assert_eq!(stats.drafted_by_pos.len(), num_draft, "{stats:?}");
    }
}

/// `--max-kv-size 12` (the first 4 positions and the last 8): speculation
/// goes on after the window moved, every round may draft its full length
/// and roll back, and the output is plain decoding's under the same bound.
#[test]
fn bounded_caches_keep_speculating_past_the_bound_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama_with(dir.path(), 11, None).expect("write model");
    let options = LoadOptions {
        max_kv_size: Some(12),
        ..LoadOptions::default()
    };
    let model = load_model(dir.path(), &options).expect("load");
    let plain = go(&model, Run::new(PROMPT, 40)).tokens;
    let oracle = Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: true,
    };
    let out = go(
        &model,
        Run {
            provider: Some(&oracle),
            num_draft: 16,
            ..Run::new(PROMPT, 40)
        },
    );
    assert_eq!(out.tokens, plain);
    assert!(!out.stats.untrimmable_fallback, "{:?}", out.stats);
    assert!(
        out.stats.rejected > 0,
        "rounds rolled back: {:?}",
        out.stats
    );
    assert_eq!(
        out.stats.drafted_by_pos.len(),
        16,
        "full-length rounds: {:?}",
        out.stats
    );
    let (_d, unbounded) = model_with(None);
    let wide = go(&unbounded, Run::new(PROMPT, 40)).tokens;
    assert_ne!(wide, plain, "the bound changes what the model sees");
}

#[test]
fn logits_processors_apply_at_every_verified_position() {
    let (_d, model) = model_with(None);
    let penalty = || -> Vec<Box<dyn LogitsProcessor + Send>> {
        vec![Box::new(RepetitionPenalty::new(1.8, 20).expect("penalty"))]
    };
    let plain = go(
        &model,
        Run {
            processors: penalty(),
            ..Run::new(PROMPT, 30)
        },
    )
    .tokens;
    let unpenalised = go(&model, Run::new(PROMPT, 30)).tokens;
    assert_ne!(
        plain, unpenalised,
        "the penalty must matter for this test to mean anything"
    );
    let oracle = Oracle {
        reference: plain.clone(),
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: true,
    };
    let out = go(
        &model,
        Run {
            provider: Some(&oracle),
            processors: penalty(),
            ..Run::new(PROMPT, 30)
        },
    );
    assert_eq!(out.tokens, plain);
    assert!(out.stats.accepted > 0);
}

/// The first tokens emitted at temperature 1 under rejection sampling with
/// a drafter that always proposes token 5, one run per seed, counted.
fn first_tokens_under_bad_drafts(
    model: &Model,
    config: impl Fn(u64) -> SamplerConfig,
    vocab: usize,
) -> Vec<usize> {
    let bad = Oracle {
        reference: vec![5; 8],
        prompt_len: PROMPT.len(),
        mode: PrefillMode::TailSplit,
        corrupt: false,
    };
    let mut counts = vec![0usize; vocab];
    for seed in 0..3000 {
        let out = go(
            model,
            Run {
                provider: Some(&bad),
                sampler: config(seed),
                verify: VerifyMode::Rejection,
                seed,
                ..Run::new(PROMPT, 1)
            },
        );
        counts[out.tokens[0] as usize] += 1;
    }
    counts
}

/// The softmax of `logits` in double precision, without the tokens `cut`
/// removes.
fn softmax_without(logits: &[f32], cut: impl Fn(usize) -> bool) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    let weights: Vec<f64> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            if cut(i) {
                0.0
            } else {
                f64::from(l - max).exp()
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

#[test]
fn rejection_sampling_is_lossless_end_to_end() {
    // The first emitted token at temperature 1 must follow the target's own
    // distribution whatever the (deliberately bad) drafts are.
    let (_d, model) = model_with(None);
    let last = mlx_spec_scenarios::last_logits(&model, PROMPT, 96);
    let p = softmax_without(&last, |_| false);
    let counts = first_tokens_under_bad_drafts(
        &model,
        |seed| SamplerConfig {
            temperature: 1.0,
            seed,
            ..SamplerConfig::default()
        },
        96,
    );
    if let Err(e) = mlx_spec_scenarios::chi_square_fits(&counts, &p) {
        panic!("{e}");
    }
}

#[test]
fn rejection_sampling_keeps_the_xtc_mixture() {
    // XTC half the time with a threshold between the third and fourth most
    // likely tokens: the first and second are cut then, so the emitted
    // distribution is half the target's and half the target's without them,
    // computed here in double precision.
    let (_d, model) = model_with(None);
    let last = mlx_spec_scenarios::last_logits(&model, PROMPT, 96);
    let p = softmax_without(&last, |_| false);
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let threshold = ((p[order[2]] + p[order[3]]) / 2.0) as f32;
    assert!(threshold <= 0.5, "the tiny model's top tokens: {threshold}");
    let cut = softmax_without(&last, |i| i == order[0] || i == order[1]);
    let mixture: Vec<f64> = p.iter().zip(&cut).map(|(a, b)| 0.5 * a + 0.5 * b).collect();
    let counts = first_tokens_under_bad_drafts(
        &model,
        |seed| SamplerConfig {
            temperature: 1.0,
            xtc_probability: 0.5,
            xtc_threshold: threshold,
            seed,
            ..SamplerConfig::default()
        },
        96,
    );
    if let Err(e) = mlx_spec_scenarios::chi_square_fits(&counts, &mixture) {
        panic!("{e}");
    }
}
