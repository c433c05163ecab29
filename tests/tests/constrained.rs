//! Constrained decoding in the serve loop, on a real (tiny, random) model
//! with a template constraint whose every answer is known: the output obeys
//! it; drafts are cut at its first refused token; the tokens it forces are
//! drafted and verified; and the output is the same with and without
//! speculation (every provider: ones that sync from the history, and the
//! heads anchored on the target's hidden states, the Gemma-4 assistant,
//! DeepSpec and GLM's MTP, which take forced tokens as a foreign tail),
//! forced drafts or batching, greedy and sampled, with the
//! log-probabilities and top log-probabilities unchanged too.

use std::ops::ControlFlow;

use mlx_rs::Array;
use serve_loop::{
    AdaptiveConfig, Finish, Output, ProviderChoice, Request, ScheduleConfig, Scheduler, ServeError,
    SpecConfig, VerifyMode,
};
use spec_core::{
    CommitInfo, Constraint, Draft, DraftProvider, DraftRequest, DraftSource, SamplerConfig,
    SpecError, Target, TokenMask,
};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, LoadOptions};

const VOCAB: usize = 96;

/// This file's tests take turns: run concurrently in one process, MLX
/// computations of the tiny DeepSpec target were seen to differ in their
/// last bits from one run to the next (a near tie then flips a token), and
/// every test here compares bits across runs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One position of a template: a fixed token or a choice among some.
#[derive(Debug, Clone)]
enum Slot {
    Fixed(u32),
    OneOf(Vec<u32>),
}

impl Slot {
    fn allows(&self, t: u32) -> bool {
        match self {
            Slot::Fixed(f) => *f == t,
            Slot::OneOf(set) => set.contains(&t),
        }
    }
}

/// A constraint that admits exactly the sequences of its slots: forced
/// runs where slots are fixed, a choice elsewhere, complete at the end.
#[derive(Debug, Clone)]
struct Template {
    slots: Vec<Slot>,
    at: usize,
}

impl Template {
    /// Choices of three tokens between runs of fixed ones.
    fn new() -> Self {
        let slots = vec![
            Slot::OneOf(vec![5, 17, 40]),
            Slot::Fixed(11),
            Slot::Fixed(12),
            Slot::Fixed(13),
            Slot::OneOf(vec![2, 30, 61, 77]),
            Slot::OneOf(vec![8, 9]),
            Slot::Fixed(50),
            Slot::Fixed(51),
            Slot::OneOf((20..40).collect()),
            Slot::OneOf((20..40).collect()),
            Slot::OneOf((20..40).collect()),
            Slot::Fixed(90),
            Slot::Fixed(91),
            Slot::Fixed(92),
            Slot::Fixed(93),
            Slot::OneOf(vec![1, 3]),
        ];
        Self { slots, at: 0 }
    }

    fn mask_at(&self, at: usize) -> TokenMask {
        match self.slots.get(at) {
            Some(Slot::Fixed(t)) => TokenMask::of_ids(&[*t], VOCAB, false),
            Some(Slot::OneOf(set)) => TokenMask::of_ids(set, VOCAB, false),
            None => TokenMask::of_ids(&[], VOCAB, true),
        }
    }
}

impl Constraint for Template {
    fn validate(&mut self, tokens: &[u32]) -> Result<usize, SpecError> {
        Ok(tokens
            .iter()
            .enumerate()
            .take_while(|(i, &t)| self.slots.get(self.at + i).is_some_and(|s| s.allows(t)))
            .count())
    }
    fn forced(&mut self, prefix: &[u32], max: usize) -> Result<Vec<u32>, SpecError> {
        Ok(self.slots[(self.at + prefix.len()).min(self.slots.len())..]
            .iter()
            .map_while(|s| match s {
                Slot::Fixed(t) => Some(*t),
                Slot::OneOf(_) => None,
            })
            .take(max)
            .collect())
    }
    fn masks(&mut self, tokens: &[u32]) -> Result<Vec<TokenMask>, SpecError> {
        Ok((0..=tokens.len())
            .map(|i| self.mask_at(self.at + i))
            .collect())
    }
    fn commit(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        if self.validate(tokens)? != tokens.len() {
            return Err(SpecError::Constraint(format!("{tokens:?} refused")));
        }
        self.at += tokens.len();
        Ok(())
    }
    fn is_complete(&self) -> bool {
        self.at >= self.slots.len()
    }
}

/// Proposes tokens the template refuses now and then, and ones it admits
/// but the model would not pick: cuts and rejections both happen.
#[derive(Debug, Clone)]
struct Wild;

struct WildSource {
    round: u32,
}

impl DraftSource for WildSource {
    fn prefill(&mut self, _: &[u32], _: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _: &mut dyn spec_core::Sampler,
    ) -> Result<Draft, SpecError> {
        self.round += 1;
        let tokens = (0..request.max_tokens as u32)
            .map(|i| match (self.round + i) % 4 {
                0 => 11,
                1 => 20 + (self.round * 7 + i) % 20,
                2 => 50,
                _ => 77,
            })
            .collect();
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        if info.accepted > info.drafted {
            return Err(SpecError::Protocol("accepted past drafted".into()));
        }
        if info.verified_hidden.shape()[1] as usize > info.drafted + 1 {
            return Err(SpecError::Protocol("a window wider than the draft".into()));
        }
        if !info.foreign.is_empty() {
            return Err(SpecError::Protocol(
                "foreign tokens for a source that does not take them".into(),
            ));
        }
        Ok(())
    }
}

impl DraftProvider for Wild {
    fn id(&self) -> &str {
        "wild"
    }
    fn open<'a>(&self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(WildSource { round: 0 }))
    }
}

fn model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 5).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

const PROMPT: &[u32] = &[7, 3, 50, 21, 8, 8, 64, 2, 19, 11, 12, 13];

#[derive(Clone)]
struct Ask {
    provider: Option<&'static str>,
    forced: bool,
    sampler: SamplerConfig,
    verify: VerifyMode,
    eos: Vec<u32>,
    top: usize,
    max_tokens: usize,
}

impl Ask {
    fn greedy() -> Self {
        Self {
            provider: None,
            forced: true,
            sampler: SamplerConfig::default(),
            verify: VerifyMode::ExactMatch,
            eos: Vec::new(),
            top: 3,
            max_tokens: 40,
        }
    }

    /// Greedy, without forced-token drafts: the plain reference.
    fn unforced() -> Self {
        Self {
            forced: false,
            ..Self::greedy()
        }
    }

    fn request(&self) -> Request {
        let config = SpecConfig {
            num_draft: 4,
            adaptive: AdaptiveConfig::off(),
            verify: self.verify,
            seed: 9,
        };
        Request {
            constraint: Some(Box::new(Template::new())),
            forced_drafts: self.forced,
            top_logprobs: self.top,
            sampler: self.sampler.clone(),
            eos: self.eos.clone(),
            speculation: self.provider.map(|id| ProviderChoice::new(id, config)),
            ..Request::new(PROMPT.to_vec(), self.max_tokens)
        }
    }
}

fn providers() -> (Wild, draft_prompt_lookup::PromptLookupProvider) {
    let lookup = draft_prompt_lookup::PromptLookupProvider::new(
        draft_prompt_lookup::PromptLookupConfig::default(),
    )
    .expect("prompt lookup");
    (Wild, lookup)
}

fn run(target: &dyn Target, ask: &Ask) -> Result<Output, ServeError> {
    let (wild, lookup) = providers();
    let held: [&dyn DraftProvider; 2] = [&wild, &lookup];
    serve_loop::generate(target, &held, ask.request(), |_| ControlFlow::Continue(()))
}

fn obeys_template(tokens: &[u32]) {
    let template = Template::new();
    assert!(tokens.len() <= template.slots.len());
    for (i, &t) in tokens.iter().enumerate() {
        assert!(
            template.slots[i].allows(t),
            "token {i} = {t} refused: {tokens:?}"
        );
    }
}

fn same(a: &Output, b: &Output, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.logprobs, b.logprobs, "{what}: log-probabilities");
    assert_eq!(
        a.top_logprobs, b.top_logprobs,
        "{what}: top log-probabilities"
    );
    assert_eq!(a.finish, b.finish, "{what}: finish");
}

#[test]
fn constrained_output_obeys_and_ends_when_complete() {
    let _turn = serial();
    let (_dir, model) = model();
    let plain = run(&model, &Ask::unforced()).expect("plain");
    obeys_template(&plain.tokens);
    assert_eq!(plain.tokens.len(), Template::new().slots.len());
    assert_eq!(
        plain.finish,
        Finish::Eos,
        "a complete template ends the request"
    );
    assert_eq!(plain.stats.drafted, 0, "no forced drafts asked for");
    // Top log-probabilities: three, most likely first, the chosen one first
    // (greedy), refused tokens never among them (they have -inf).
    for (i, (top, &lp)) in plain.top_logprobs.iter().zip(&plain.logprobs).enumerate() {
        assert_eq!(top.len(), 3);
        assert_eq!(top[0], (plain.tokens[i], lp), "position {i}");
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
        let fixed = matches!(Template::new().slots[i], Slot::Fixed(_));
        assert_eq!(
            fixed,
            top[1].1 == f32::NEG_INFINITY,
            "position {i}: {top:?}"
        );
    }
    // Unconstrained, the model picks other tokens: the mask did the work.
    let free = serve_loop::generate(&model, &[], Request::new(PROMPT.to_vec(), 16), |_| {
        ControlFlow::Continue(())
    })
    .expect("free");
    assert_ne!(free.tokens, plain.tokens);
    // With an EOS token, the model may only end where the template does.
    let eos = run(
        &model,
        &Ask {
            eos: vec![95],
            forced: false,
            ..Ask::greedy()
        },
    )
    .expect("eos");
    same(&plain, &eos, "an EOS token allowed only at the end");
    // Too few tokens: it ends by length, obeying so far.
    let short = run(
        &model,
        &Ask {
            max_tokens: 6,
            ..Ask::greedy()
        },
    )
    .expect("short");
    assert_eq!(short.finish, Finish::MaxTokens);
    assert_eq!(short.tokens, plain.tokens[..6]);
}

#[test]
fn forced_tokens_and_cut_drafts_leave_the_output_unchanged() {
    let _turn = serial();
    let (_dir, model) = model();
    let plain = run(&model, &Ask::unforced()).expect("plain");
    let forced = run(&model, &Ask::greedy()).expect("forced");
    same(&plain, &forced, "forced drafts");
    assert_eq!(
        forced.stats.forced_drafted, 9,
        "every fixed slot after a choice"
    );
    assert_eq!(
        forced.stats.forced_accepted, 9,
        "the mask leaves one token: taken"
    );
    assert!(forced.stats.target_calls < plain.stats.target_calls);
    for provider in ["wild", "prompt-lookup"] {
        for forced_drafts in [true, false] {
            let ask = Ask {
                provider: Some(provider),
                forced: forced_drafts,
                ..Ask::greedy()
            };
            let out = run(&model, &ask).expect("speculative");
            same(&plain, &out, &format!("{provider}, forced {forced_drafts}"));
            if provider == "wild" {
                assert!(out.stats.refused_drafts > 0, "the template cut drafts");
                assert_eq!(
                    out.stats.forced_drafted, 0,
                    "wild keeps state: never extended"
                );
            }
        }
    }
}

#[test]
fn sampled_constrained_output_is_the_same_with_speculation() {
    let _turn = serial();
    let (_dir, model) = model();
    let sampler = SamplerConfig {
        temperature: 1.0,
        seed: 4,
        ..SamplerConfig::default()
    };
    let ask = Ask {
        sampler,
        forced: false,
        ..Ask::greedy()
    };
    let plain = run(&model, &ask).expect("plain");
    obeys_template(&plain.tokens);
    for provider in [None, Some("wild"), Some("prompt-lookup")] {
        let out = run(
            &model,
            &Ask {
                provider,
                forced: true,
                ..ask.clone()
            },
        )
        .expect("speculative");
        same(&plain, &out, &format!("sampled, {provider:?}"));
    }
    // Rejection sampling stays inside the mask.
    let rejection = run(
        &model,
        &Ask {
            provider: Some("wild"),
            verify: VerifyMode::Rejection,
            ..ask.clone()
        },
    )
    .expect("rejection");
    obeys_template(&rejection.tokens);
}

#[test]
fn batched_rows_with_and_without_constraints_match_their_solo_runs() {
    let _turn = serial();
    let (_dir, model) = model();
    let asks = [
        Ask::greedy(),
        Ask {
            provider: Some("wild"),
            ..Ask::greedy()
        },
        Ask {
            provider: Some("prompt-lookup"),
            top: 0,
            ..Ask::greedy()
        },
    ];
    let solo: Vec<Output> = asks.iter().map(|a| run(&model, a).expect("solo")).collect();
    let free_solo = serve_loop::generate(&model, &[], Request::new(PROMPT.to_vec(), 12), |_| {
        ControlFlow::Continue(())
    })
    .expect("free solo");

    let (wild, lookup) = providers();
    let held: [&dyn DraftProvider; 2] = [&wild, &lookup];
    let mut scheduler = Scheduler::new(&model, ScheduleConfig::default())
        .expect("scheduler")
        .with_providers(&held);
    let mut ids = Vec::new();
    for ask in &asks {
        ids.push(
            scheduler
                .submit(ask.request(), |_| ControlFlow::Continue(()))
                .expect("submit"),
        );
    }
    let free = scheduler
        .submit(Request::new(PROMPT.to_vec(), 12), |_| {
            ControlFlow::Continue(())
        })
        .expect("submit");
    let mut done = Vec::new();
    let mut most_rows = 0;
    for _ in 0..1000 {
        let report = scheduler.step();
        most_rows = most_rows.max(report.rows);
        done.extend(report.finished);
        if scheduler.is_idle() {
            break;
        }
    }
    assert!(most_rows >= 3, "rows shared steps");
    for (ask_id, solo) in ids.iter().zip(&solo) {
        let f = done.iter().find(|f| f.id == *ask_id).expect("finished");
        same(solo, f.result.as_ref().expect("batched"), "batched");
    }
    let f = done.iter().find(|f| f.id == free).expect("free finished");
    assert_eq!(f.result.as_ref().expect("free").tokens, free_solo.tokens);
}

/// A constraint that refuses everything from the start: the request ends
/// (an error naming the constraint), and nothing else is disturbed.
#[derive(Debug)]
struct Broken;

impl Constraint for Broken {
    fn validate(&mut self, _: &[u32]) -> Result<usize, SpecError> {
        Ok(0)
    }
    fn forced(&mut self, _: &[u32], _: usize) -> Result<Vec<u32>, SpecError> {
        Ok(Vec::new())
    }
    fn masks(&mut self, tokens: &[u32]) -> Result<Vec<TokenMask>, SpecError> {
        Ok(vec![TokenMask::of_ids(&[], VOCAB, false); tokens.len() + 1])
    }
    fn commit(&mut self, _: &[u32]) -> Result<(), SpecError> {
        Err(SpecError::Constraint("refused".into()))
    }
    fn is_complete(&self) -> bool {
        false
    }
}

#[test]
fn a_constraint_that_allows_nothing_fails_its_request_only() {
    let _turn = serial();
    let (_dir, model) = model();
    let broken = || Request {
        constraint: Some(Box::new(Broken)),
        ..Request::new(PROMPT.to_vec(), 8)
    };
    let err = serve_loop::generate(&model, &[], broken(), |_| ControlFlow::Continue(()))
        .expect_err("a dead end");
    assert!(err.to_string().contains("constraint"), "{err}");

    // In a batch, the request beside it gets what it gets alone.
    let solo = run(&model, &Ask::greedy()).expect("solo");
    let mut scheduler = Scheduler::new(&model, ScheduleConfig::default()).expect("scheduler");
    let good = scheduler
        .submit(Ask::greedy().request(), |_| ControlFlow::Continue(()))
        .expect("submit");
    let bad = scheduler
        .submit(broken(), |_| ControlFlow::Continue(()))
        .expect("submit");
    let mut done = Vec::new();
    for _ in 0..1000 {
        done.extend(scheduler.step().finished);
        if scheduler.is_idle() {
            break;
        }
    }
    let result = |id| &done.iter().find(|f| f.id == id).expect("finished").result;
    assert!(result(bad).is_err());
    same(
        &solo,
        result(good).as_ref().expect("good"),
        "beside a failing constraint",
    );
}

#[test]
fn rejection_sampling_is_lossless_against_the_masked_distribution() {
    let _turn = serial();
    // The first token at temperature 1, drafted by `wild` (a point proposal
    // the mask allows) and judged by rejection sampling, must follow the
    // target's distribution renormalized over the tokens the mask allows.
    let (_dir, model) = model();
    let last = mlx_spec_scenarios::last_logits(&model, PROMPT, VOCAB);
    let allowed: Vec<u32> = (20..44).collect();
    let max = last.iter().cloned().fold(f32::MIN, f32::max);
    let weight = |i: usize| {
        if allowed.contains(&(i as u32)) {
            f64::from(last[i] - max).exp()
        } else {
            0.0
        }
    };
    let total: f64 = (0..VOCAB).map(weight).sum();
    let p: Vec<f64> = (0..VOCAB).map(|i| weight(i) / total).collect();

    let (wild, lookup) = providers();
    let held: [&dyn DraftProvider; 2] = [&wild, &lookup];
    let draws = 3000;
    let mut counts = vec![0usize; VOCAB];
    for seed in 0..draws {
        let request = Request {
            constraint: Some(Box::new(Template {
                slots: vec![Slot::OneOf(allowed.clone())],
                at: 0,
            })),
            sampler: SamplerConfig {
                temperature: 1.0,
                seed,
                ..SamplerConfig::default()
            },
            speculation: Some(ProviderChoice::new(
                "wild",
                SpecConfig {
                    num_draft: 1,
                    adaptive: AdaptiveConfig::off(),
                    verify: VerifyMode::Rejection,
                    seed,
                },
            )),
            ..Request::new(PROMPT.to_vec(), 1)
        };
        let out = serve_loop::generate(&model, &held, request, |_| ControlFlow::Continue(()))
            .expect("generate");
        assert_eq!(out.stats.drafted, 1, "the draft is allowed: verified");
        counts[out.tokens[0] as usize] += 1;
    }
    let outside: usize = (0..VOCAB)
        .filter(|i| !allowed.contains(&(*i as u32)))
        .map(|i| counts[i])
        .sum();
    assert_eq!(outside, 0, "draws outside the mask: {counts:?}");
    if let Err(e) = mlx_spec_scenarios::chi_square_fits(&counts, &p) {
        panic!("{e}");
    }
}

#[test]
fn a_prefix_cache_hit_leaves_constrained_output_unchanged() {
    let _turn = serial();
    let (_dir, model) = model();
    let (wild, lookup) = providers();
    let held: [&dyn DraftProvider; 2] = [&wild, &lookup];
    let ask = Ask {
        provider: Some("prompt-lookup"),
        ..Ask::greedy()
    };
    let cold = run(&model, &ask).expect("cold");
    let mut scheduler = Scheduler::new(
        &model,
        ScheduleConfig {
            prefill_chunk: 4,
            ..ScheduleConfig::default()
        },
    )
    .expect("scheduler")
    .with_providers(&held)
    .with_prefix_cache(serve_loop::PrefixCacheConfig::default());
    let mut outputs = Vec::new();
    for _ in 0..2 {
        let id = scheduler
            .submit(ask.request(), |_| ControlFlow::Continue(()))
            .expect("submit");
        for _ in 0..1000 {
            let report = scheduler.step();
            if let Some(f) = report.finished.into_iter().find(|f| f.id == id) {
                outputs.push(f.result.expect("output"));
                break;
            }
        }
    }
    assert_eq!(outputs.len(), 2);
    assert_eq!(outputs[0].cached_tokens, 0);
    assert!(
        outputs[1].cached_tokens > 0,
        "the second request hit the cache"
    );
    // The cache holds prompt rows only: the constraint starts afresh.
    same(&cold, &outputs[0], "first");
    same(&cold, &outputs[1], "from the prefix cache");
}

#[test]
fn a_draft_model_takes_forced_tokens_after_its_drafts_and_stays_exact() {
    let _turn = serial();
    use draft_model as _;
    let (dir, model) = model();
    let options: spec_core::ProviderOptions = [("model", dir.path().display().to_string())]
        .into_iter()
        .collect();
    let drafter = serve_loop::build_provider("draft-model", &model, &options).expect("drafter");
    let plain = run(&model, &Ask::unforced()).expect("plain");
    for forced in [true, false] {
        let ask = Ask {
            provider: Some("draft-model"),
            forced,
            ..Ask::greedy()
        };
        let out = serve_loop::generate(&model, &[drafter.as_ref()], ask.request(), |_| {
            ControlFlow::Continue(())
        })
        .expect("draft model");
        same(&plain, &out, &format!("draft model, forced {forced}"));
        // The drafter is the target itself: its drafts are the target's
        // unconstrained picks, which the template refuses at times.
        assert!(out.stats.refused_drafts > 0);
        if forced {
            assert!(out.stats.forced_accepted > 0, "{:?}", out.stats);
        } else {
            assert_eq!(out.stats.forced_drafted, 0);
        }
    }
}

#[test]
fn the_gemma4_assistant_takes_forced_tokens_and_stays_exact() {
    let _turn = serial();
    use draft_gemma4_assistant as _;
    use mlx_spec_scenarios::{
        write_tiny_assistant, write_tiny_gemma4, AssistantHead, Gemma4Variant,
    };
    let target_dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gemma4(target_dir.path(), 5, Gemma4Variant::Text, 8).expect("write target");
    let target = load_model(target_dir.path(), &LoadOptions::default()).expect("load target");
    let assistant_dir = tempfile::tempdir().expect("tempdir");
    write_tiny_assistant(assistant_dir.path(), 3, AssistantHead::Tied, 64, 96, 8)
        .expect("write assistant");
    let options: spec_core::ProviderOptions =
        [("model", assistant_dir.path().display().to_string())]
            .into_iter()
            .collect();
    let assistant =
        serve_loop::build_provider("gemma4-assistant", &target, &options).expect("assistant");
    let ask = Ask::unforced();
    let plain = serve_loop::generate(&target, &[], ask.request(), |_| ControlFlow::Continue(()))
        .expect("plain");
    obeys_template(&plain.tokens);
    for forced in [true, false] {
        let ask = Ask {
            provider: Some("gemma4-assistant"),
            forced,
            ..Ask::greedy()
        };
        let out = serve_loop::generate(&target, &[assistant.as_ref()], ask.request(), |_| {
            ControlFlow::Continue(())
        })
        .expect("assistant");
        same(&plain, &out, &format!("assistant, forced {forced}"));
        anchored_stats(&out, forced, "assistant");
    }
}

/// An anchored head's run drafted, and with forced drafts had forced
/// tokens accepted after its own drafts (the foreign tail).
fn anchored_stats(out: &Output, forced: bool, what: &str) {
    let s = &out.stats;
    assert!(
        s.drafted + s.refused_drafts > s.forced_drafted,
        "{what} drafted: {s:?}"
    );
    if forced {
        assert!(s.forced_accepted > 0, "{what}: forced tokens taken: {s:?}");
    } else {
        assert_eq!(s.forced_drafted, 0, "{what}: {s:?}");
    }
}

#[test]
fn glm_mtp_takes_forced_tokens_and_stays_exact() {
    let _turn = serial();
    use draft_glm52_mtp as _;
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::glm::Glm::default()
        .write(dir.path())
        .expect("write GLM");
    let target = load_model(dir.path(), &LoadOptions::default()).expect("load GLM");
    let mtp = serve_loop::build_provider(
        draft_glm52_mtp::ID,
        &target,
        &spec_core::ProviderOptions::new(),
    )
    .expect("MTP");
    let plain = serve_loop::generate(&target, &[], Ask::unforced().request(), |_| {
        ControlFlow::Continue(())
    })
    .expect("plain");
    obeys_template(&plain.tokens);
    for forced in [true, false] {
        let ask = Ask {
            provider: Some(draft_glm52_mtp::ID),
            forced,
            ..Ask::greedy()
        };
        let out = serve_loop::generate(&target, &[mtp.as_ref()], ask.request(), |_| {
            ControlFlow::Continue(())
        })
        .expect("MTP");
        same(&plain, &out, &format!("MTP, forced {forced}"));
        anchored_stats(&out, forced, "MTP");
    }
}

/// Runs `id` (built with `options`) on `target` under the template, with
/// and without forced drafts: the output equals plain constrained decoding
/// and forced tokens follow the head's drafts.
fn anchored_head_stays_exact(
    target: &Model,
    id: &'static str,
    options: &spec_core::ProviderOptions,
) {
    let provider = serve_loop::build_provider(id, target, options).expect("provider");
    let plain = serve_loop::generate(target, &[], Ask::unforced().request(), |_| {
        ControlFlow::Continue(())
    })
    .expect("plain");
    obeys_template(&plain.tokens);
    for forced in [true, false] {
        let ask = Ask {
            provider: Some(id),
            forced,
            ..Ask::greedy()
        };
        let out = serve_loop::generate(target, &[provider.as_ref()], ask.request(), |_| {
            ControlFlow::Continue(())
        })
        .expect("speculative");
        same(&plain, &out, &format!("{id}, forced {forced}"));
        anchored_stats(&out, forced, id);
    }
}

#[test]
fn qwen3_mtp_takes_forced_tokens_and_stays_exact() {
    let _turn = serial();
    use draft_qwen3_mtp as _;
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::qwen3_next::GATE_QWEN3_5
        .tiny(4)
        .write(dir.path())
        .expect("write qwen3_5");
    let target = load_model(dir.path(), &LoadOptions::default()).expect("load qwen3_5");
    anchored_head_stays_exact(
        &target,
        draft_qwen3_mtp::ID,
        &spec_core::ProviderOptions::new(),
    );
}

#[test]
fn eagle3_takes_forced_tokens_and_stays_exact() {
    let _turn = serial();
    use draft_eagle3 as _;
    let (target_dir, head_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    mlx_spec_scenarios::write_tiny_eagle3_pair(target_dir.path(), head_dir.path())
        .expect("write the pair");
    let target = load_model(target_dir.path(), &LoadOptions::default()).expect("load target");
    let options: spec_core::ProviderOptions = [("model", head_dir.path().display().to_string())]
        .into_iter()
        .collect();
    anchored_head_stays_exact(&target, draft_eagle3::ID, &options);
}

#[test]
fn deepspec_takes_forced_tokens_and_stays_exact() {
    let _turn = serial();
    use draft_deepspec as _;
    // A target DSpark's tiny drafter fits: hidden 32, 3 layers, vocabulary 64.
    let target_dir = tempfile::tempdir().expect("tempdir");
    let drafter_dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_deepspec_pair(target_dir.path(), drafter_dir.path())
        .expect("write target and drafter");
    let target = load_model(target_dir.path(), &LoadOptions::default()).expect("load target");
    let options: spec_core::ProviderOptions = [("model", drafter_dir.path().display().to_string())]
        .into_iter()
        .collect();
    let deepspec = serve_loop::build_provider("deepspec", &target, &options).expect("deepspec");
    // The template within the vocabulary of 64.
    let template = || Template {
        slots: vec![
            Slot::OneOf(vec![5, 17, 40]),
            Slot::Fixed(11),
            Slot::Fixed(12),
            Slot::OneOf((20..40).collect()),
            Slot::OneOf((20..40).collect()),
            Slot::Fixed(50),
            Slot::OneOf(vec![2, 30, 61]),
            Slot::OneOf((0..64).collect()),
            Slot::OneOf((0..64).collect()),
            Slot::Fixed(7),
        ],
        at: 0,
    };
    let request = |speculation: Option<ProviderChoice>| Request {
        constraint: Some(Box::new(template())),
        top_logprobs: 2,
        speculation,
        ..Request::new(PROMPT.to_vec(), 24)
    };
    let plain = serve_loop::generate(&target, &[], request(None), |_| ControlFlow::Continue(()))
        .expect("plain");
    assert_eq!(plain.tokens.len(), 10, "{:?}", plain.tokens);
    let config = SpecConfig {
        num_draft: 4,
        adaptive: AdaptiveConfig::off(),
        ..SpecConfig::default()
    };
    for forced in [true, false] {
        let out = serve_loop::generate(
            &target,
            &[deepspec.as_ref()],
            Request {
                forced_drafts: forced,
                ..request(Some(ProviderChoice::new("deepspec", config.clone())))
            },
            |_| ControlFlow::Continue(()),
        )
        .expect("deepspec");
        same(&plain, &out, &format!("deepspec, forced {forced}"));
        anchored_stats(&out, forced, "deepspec");
    }
}
