//! Many requests through one scheduler: every request's tokens and
//! log-probabilities equal its run alone, whatever shares its steps (mixed
//! providers and plain rows, prompts longer than the prefill chunk,
//! staggered arrivals, rows ending by EOS, max tokens, cancellation, a
//! provider failing mid-round), greedy and seeded sampling alike. These
//! runs size drafts with each request's own controller, so a request's
//! draft counts match too; with the goodput policy (lengths chosen per step
//! from the batch and the measured step cost) only the counts may differ.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlx_rs::Array;
use serve_loop::{
    AdaptiveConfig, DraftPolicy, Finish, Output, ProviderChoice, Request, ScheduleConfig,
    Scheduler, ServeError, SpecConfig, StepCost, VerifyMode,
};
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, LogitsProcessor, PrefillMode,
    ProviderOptions, RepetitionPenalty, RequestOutcome, Sampler, SamplerConfig, SpecError, Target,
};
use spec_models::{load_model, LoadOptions, LoadedModel};

mod hybrid;

use draft_model as _;
use draft_prompt_lookup as _;
use draft_suffix as _;

const VOCAB: u32 = 96;

/// What one request showed a probe: its prompt, every tap value, its end.
type Seen = (Vec<u32>, Vec<f32>, RequestOutcome);

/// A fake provider that drafts a fixed rule, can fail at its n-th draft,
/// taps layers in its own order, and logs what each request showed it.
#[derive(Clone)]
struct Probe {
    id: &'static str,
    mode: PrefillMode,
    taps: Vec<usize>,
    fail_at_draft: Option<usize>,
    /// Per finished request: its prompt, every tap value it was given, how
    /// it ended.
    log: Rc<RefCell<Vec<Seen>>>,
}

impl Probe {
    fn new(id: &'static str, mode: PrefillMode, taps: &[usize]) -> Self {
        Self {
            id,
            mode,
            taps: taps.to_vec(),
            fail_at_draft: None,
            log: Rc::default(),
        }
    }
}

struct ProbeSource {
    probe: Probe,
    prompt: Vec<u32>,
    seen: Vec<f32>,
    drafts: usize,
}

fn values(a: &Array) -> Vec<f32> {
    // A copy (times one keeps every bit): row slices are strided views.
    let a = a.multiply(Array::from_f32(1.0)).expect("copy taps");
    a.eval().expect("eval taps");
    a.as_slice::<f32>().to_vec()
}

impl DraftSource for ProbeSource {
    fn prefill_mode(&self) -> PrefillMode {
        self.probe.mode
    }
    fn tap_layers(&self) -> &[usize] {
        &self.probe.taps
    }
    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        self.prompt = prompt.to_vec();
        if let Some(t) = taps {
            self.seen.extend(values(t));
        }
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.drafts += 1;
        if self.probe.fail_at_draft == Some(self.drafts) {
            return Err(SpecError::Model("injected drafter failure".into()));
        }
        // Copy what followed the pending token the last time it occurred.
        let h = request.history;
        let last = h[h.len() - 1];
        let from = h[..h.len() - 1]
            .iter()
            .rposition(|&t| t == last)
            .map_or(h.len(), |i| i + 1);
        let mut tokens: Vec<u32> = h[from..].iter().copied().take(request.max_tokens).collect();
        if tokens.is_empty() {
            tokens.push((last * 7 + 3) % VOCAB);
        }
        Ok(Draft {
            tokens,
            probs: None,
        })
    }
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        if let Some(t) = info.verified_taps {
            self.seen.extend(values(t));
        }
        Ok(())
    }
    fn finish(&mut self, outcome: RequestOutcome) {
        self.probe.log.borrow_mut().push((
            std::mem::take(&mut self.prompt),
            std::mem::take(&mut self.seen),
            outcome,
        ));
    }
}

impl DraftProvider for Probe {
    fn id(&self) -> &str {
        self.id
    }
    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(ProbeSource {
            probe: self.clone(),
            prompt: Vec::new(),
            seen: Vec::new(),
            drafts: 0,
        }))
    }
}

/// One request of a scenario.
#[derive(Clone)]
struct Spec {
    prompt: Vec<u32>,
    max_tokens: usize,
    /// Index into the scenario's providers.
    provider: Option<usize>,
    temperature: f32,
    seed: u64,
    verify: VerifyMode,
    eos: Option<u32>,
    cancel_after: Option<usize>,
    penalty: bool,
    /// The step at which it is submitted.
    join: usize,
    /// How its controller's lengths are chosen.
    policy: DraftPolicy,
}

impl Spec {
    fn new(prompt: Vec<u32>, max_tokens: usize, provider: Option<usize>, join: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            provider,
            temperature: 0.0,
            seed: 0,
            verify: VerifyMode::ExactMatch,
            eos: None,
            cancel_after: None,
            penalty: false,
            join,
            policy: DraftPolicy::PerRow,
        }
    }
}

/// The request `spec` describes, speculating with one of `providers`, and
/// its cancel flag.
fn request(spec: &Spec, providers: &[&dyn DraftProvider]) -> (Request, Arc<AtomicBool>) {
    let cancel = Arc::new(AtomicBool::new(false));
    let processors: Vec<Box<dyn LogitsProcessor + Send>> = if spec.penalty {
        vec![Box::new(RepetitionPenalty::new(1.5, 6).expect("penalty"))]
    } else {
        Vec::new()
    };
    let req = Request {
        eos: spec.eos.into_iter().collect(),
        sampler: SamplerConfig {
            temperature: spec.temperature,
            seed: spec.seed,
            ..SamplerConfig::default()
        },
        processors,
        speculation: spec.provider.map(|i| {
            let config = SpecConfig {
                num_draft: 4,
                verify: spec.verify,
                adaptive: AdaptiveConfig::with_policy(spec.policy),
                seed: spec.seed,
            };
            ProviderChoice::new(providers[i].id(), config)
        }),
        cancel: Some(Arc::clone(&cancel)),
        ..Request::new(spec.prompt.clone(), spec.max_tokens)
    };
    (req, cancel)
}

/// Sets the cancel flag once `after` tokens were emitted.
fn canceller(after: Option<usize>, cancel: Arc<AtomicBool>) -> impl FnMut() {
    let mut n = 0;
    move || {
        n += 1;
        if after.is_some_and(|a| n >= a) {
            cancel.store(true, Ordering::Relaxed);
        }
    }
}

fn config() -> ScheduleConfig {
    ScheduleConfig {
        max_batch: 3,
        prefill_chunk: 8,
        prefill_budget: 8,
    }
}

fn alone(
    model: &dyn Target,
    providers: &[&dyn DraftProvider],
    spec: &Spec,
) -> Result<Output, ServeError> {
    let (req, cancel) = request(spec, providers);
    let mut tick = canceller(spec.cancel_after, cancel);
    serve_loop::generate_with(model, providers, req, &config(), None, |_| {
        tick();
        ControlFlow::Continue(())
    })
}

/// Runs `specs` through one scheduler; returns each result and the most
/// rows a step held.
fn batched(
    model: &dyn Target,
    providers: &[&dyn DraftProvider],
    specs: &[Spec],
) -> (Vec<Result<Output, ServeError>>, usize) {
    batched_from(model, providers, specs, StepCost::new())
}

/// [`batched`] with `cost` as the scheduler's step cost model.
fn batched_from(
    model: &dyn Target,
    providers: &[&dyn DraftProvider],
    specs: &[Spec],
    cost: StepCost,
) -> (Vec<Result<Output, ServeError>>, usize) {
    let mut scheduler = Scheduler::new(model, config())
        .expect("scheduler")
        .with_providers(providers)
        .with_step_cost(cost);
    let mut ids = Vec::new();
    let mut results: Vec<Option<Result<Output, ServeError>>> = specs.iter().map(|_| None).collect();
    let mut most_rows = 0;
    let mut step = 0;
    while results.iter().any(Option::is_none) {
        for (i, spec) in specs.iter().enumerate() {
            if spec.join == step {
                let (req, cancel) = request(spec, providers);
                let mut tick = canceller(spec.cancel_after, cancel);
                match scheduler.submit(req, move |_| {
                    tick();
                    ControlFlow::Continue(())
                }) {
                    Ok(id) => ids.push((id, i)),
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
        }
        let report = scheduler.step();
        most_rows = most_rows.max(report.rows);
        for f in report.finished {
            let i = ids.iter().find(|(id, _)| *id == f.id).expect("known id").1;
            results[i] = Some(f.result);
        }
        step += 1;
        assert!(step < 10_000, "the scheduler never drained");
    }
    assert!(scheduler.is_idle());
    (results.into_iter().map(Option::unwrap).collect(), most_rows)
}

fn model_dir(seed: u64) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), seed).expect("write model");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    // Repeats a short phrase so prompt lookup finds matches.
    (0..len as u32)
        .map(|i| (seed * 13 + (i % 7) * 11 + i / 7) % VOCAB)
        .collect()
}

/// Every batched result equals the alone one, bit for bit.
fn check(
    model: &dyn Target,
    providers: &[&dyn DraftProvider],
    specs: &[Spec],
) -> Vec<Result<Output, ServeError>> {
    let (batch, most_rows) = batched(model, providers, specs);
    assert!(
        most_rows >= 2,
        "some step must hold several rows ({most_rows})"
    );
    for (i, (spec, got)) in specs.iter().zip(&batch).enumerate() {
        let want = alone(model, providers, spec);
        match (got, &want) {
            (Ok(got), Ok(want)) => {
                assert_eq!(got.tokens, want.tokens, "request {i}: tokens");
                let (g, w): (Vec<u32>, Vec<u32>) = (
                    got.logprobs.iter().map(|l| l.to_bits()).collect(),
                    want.logprobs.iter().map(|l| l.to_bits()).collect(),
                );
                assert_eq!(g, w, "request {i}: log-probabilities");
                assert_eq!(got.finish, want.finish, "request {i}: finish");
                assert_eq!(
                    got.stats.drafted, want.stats.drafted,
                    "request {i}: drafted"
                );
                assert_eq!(
                    got.stats.accepted, want.stats.accepted,
                    "request {i}: accepted"
                );
            }
            (Err(g), Err(w)) => assert_eq!(g.to_string(), w.to_string(), "request {i}"),
            _ => panic!("request {i}: batched {got:?} alone {want:?}"),
        }
    }
    batch
}

fn build(id: &str, model: &dyn Target, options: ProviderOptions) -> Box<dyn DraftProvider> {
    serve_loop::build_provider(id, model, &options).expect("provider")
}

#[test]
fn greedy_batches_with_mixed_providers_equal_each_request_alone() {
    let (_d, model) = model_dir(11);
    let (draft_dir, _) = model_dir(11);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    let drafter = build(
        "draft-model",
        &model,
        ProviderOptions::from([("model", draft_dir.path().to_string_lossy().into_owned())]),
    );
    let full = Probe::new("probe-full", PrefillMode::Full, &[1, 0]);
    let tail = Probe::new("probe-tail", PrefillMode::TailSplit, &[0]);
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref(), drafter.as_ref(), &full, &tail];

    // The alone run of request 0 shows a token to end request 5 by EOS.
    let plain0 = alone(&model, &providers, &Spec::new(prompt(1, 9), 24, None, 0)).expect("alone");
    let mut specs = vec![
        Spec::new(prompt(1, 9), 24, None, 0),
        Spec::new(prompt(2, 27), 20, Some(0), 0),
        Spec::new(prompt(3, 5), 30, Some(1), 1),
        Spec::new(prompt(4, 19), 16, Some(2), 2),
        Spec::new(prompt(5, 12), 18, Some(3), 4),
        Spec::new(prompt(1, 9), 24, Some(0), 5),
        Spec::new(prompt(6, 1), 12, None, 7),
        Spec::new(prompt(7, 33), 40, Some(2), 7),
    ];
    specs[5].eos = Some(plain0.tokens[6]);
    specs[6].penalty = true;
    specs[7].cancel_after = Some(5);
    specs[2].max_tokens = 7;
    let out = check(&model, &providers, &specs);
    let finishes: Vec<Finish> = out.iter().map(|o| o.as_ref().expect("ok").finish).collect();
    assert_eq!(finishes[5], Finish::Eos);
    assert_eq!(finishes[7], Finish::Cancelled);
    assert_eq!(finishes[2], Finish::MaxTokens);
    // The draft model is the target itself: its drafts are accepted.
    assert!(
        out[2].as_ref().expect("ok").stats.accepted > 0,
        "the draft model accepted drafts"
    );

    // Each probe request told its source how it ended exactly once, and the
    // taps it saw (its own layers, its own order) are those it sees alone.
    let log = full.log.borrow();
    let of = |p: &[u32]| -> Vec<&Seen> { log.iter().filter(|(q, ..)| q == p).collect() };
    let runs = of(&specs[7].prompt);
    assert_eq!(runs.len(), 2, "batched and alone");
    assert_eq!(runs[0].2, RequestOutcome::Cancelled);
    assert!(!runs[0].1.is_empty());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&runs[0].1), bits(&runs[1].1), "taps batched vs alone");
    let runs = of(&specs[3].prompt);
    assert_eq!(
        (runs[0].2, bits(&runs[0].1)),
        (RequestOutcome::Completed, bits(&runs[1].1))
    );
    // Its prefill taps are the target's own for its layers in its order
    // ([1, 0]), chunk by chunk on the prefill grid, then the last token.
    let p = &specs[3].prompt;
    let mut caches = model.make_caches();
    let mut want = Vec::new();
    for range in [0..8, 8..16, 16..p.len() - 1, p.len() - 1..p.len()] {
        let ids = Array::from_slice(&p[range.clone()], &[1, range.len() as i32]);
        let out = model.forward(&ids, &mut caches, &[1, 0]).expect("forward");
        want.extend(values(&out.taps.expect("taps")));
    }
    assert_eq!(bits(&runs[0].1[..want.len()]), bits(&want), "prefill taps");
    let tail_log = tail.log.borrow();
    assert_eq!(tail_log.len(), 2);
    assert_eq!(bits(&tail_log[0].1), bits(&tail_log[1].1));
}

/// A step cost model that has seen `steps` steps of `base` seconds plus
/// `per_token` seconds per token.
fn primed(base: f64, per_token: f64, steps: usize) -> StepCost {
    let mut cost = StepCost::new();
    for i in 0..steps {
        let tokens = 3 + i % 9;
        cost.observe(1 + i % 3, tokens, base + per_token * tokens as f64);
    }
    cost
}

#[test]
fn goodput_lengths_give_the_tokens_of_per_row_lengths_and_of_plain_decoding() {
    let (_d, model) = model_dir(11);
    let (draft_dir, _) = model_dir(13);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    let drafter = build(
        "draft-model",
        &model,
        ProviderOptions::from([("model", draft_dir.path().to_string_lossy().into_owned())]),
    );
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref(), drafter.as_ref()];
    let specs = |provider: fn(usize) -> Option<usize>, policy| -> Vec<Spec> {
        (0..6)
            .map(|i| {
                let mut s = Spec::new(prompt(i as u32 + 1, 9 + 5 * i), 28, provider(i), i / 2);
                s.policy = policy;
                s.penalty = i == 4;
                s
            })
            .collect()
    };
    let lookup_or_model = |i: usize| Some(i % 2);
    let tokens = |out: &[Result<Output, ServeError>]| -> Vec<(Vec<u32>, Vec<u32>, Finish)> {
        out.iter()
            .map(|o| {
                let o = o.as_ref().expect("ok");
                let bits = o.logprobs.iter().map(|l| l.to_bits()).collect();
                (o.tokens.clone(), bits, o.finish)
            })
            .collect()
    };
    let (plain, _) = batched(&model, &providers, &specs(|_| None, DraftPolicy::PerRow));
    let (per_row, _) = batched(
        &model,
        &providers,
        &specs(lookup_or_model, DraftPolicy::PerRow),
    );
    let want = tokens(&plain);
    assert_eq!(tokens(&per_row), want, "per-row lengths against plain");
    // Cheap tokens (drafts to each controller's length), dear tokens (most
    // drafts cut to zero, probes), and the model learning this machine's
    // own steps from nothing: the lengths differ, the tokens do not.
    for (what, cost) in [
        ("cheap tokens", primed(0.050, 0.00001, 20)),
        ("dear tokens", primed(0.001, 0.050, 20)),
        ("learned here", StepCost::new()),
    ] {
        let (goodput, most_rows) = batched_from(
            &model,
            &providers,
            &specs(lookup_or_model, DraftPolicy::Goodput),
            cost,
        );
        assert!(most_rows >= 2, "{what}: some step held several rows");
        assert_eq!(tokens(&goodput), want, "{what}: goodput against plain");
        let drafted: usize = goodput
            .iter()
            .map(|o| o.as_ref().map_or(0, |o| o.stats.drafted))
            .sum();
        if what == "dear tokens" {
            let per_row_drafted: usize = per_row
                .iter()
                .map(|o| o.as_ref().map_or(0, |o| o.stats.drafted))
                .sum();
            assert!(
                drafted < per_row_drafted,
                "{what}: dear tokens cut drafts ({drafted} against {per_row_drafted})"
            );
            // Prompt lookup drafts cheaply: it drafted at full length
            // before the step's lengths were chosen, and what the policy
            // cut never reached a window (the source heard of it as
            // rejected; the tokens above are plain's).
            let cut: usize = goodput
                .iter()
                .map(|o| o.as_ref().map_or(0, |o| o.stats.cut_drafts))
                .sum();
            assert!(cut > 0, "{what}: lookup drafts made ahead were cut");
        }
    }
    // A row alone in its steps keeps its controller's lengths, however dear
    // tokens are: it drafts what per-row lengths draft.
    let drafted_alone = |policy| {
        let one: Vec<Spec> = specs(lookup_or_model, policy)
            .into_iter()
            .skip(1)
            .take(1)
            .collect();
        let (out, _) = batched_from(&model, &providers, &one, primed(0.001, 0.050, 20));
        out[0].as_ref().expect("ok").stats.drafted
    };
    let per_row_alone = drafted_alone(DraftPolicy::PerRow);
    assert!(per_row_alone > 0);
    assert_eq!(drafted_alone(DraftPolicy::Goodput), per_row_alone);
    // Alone, a greedy goodput request gives its plain tokens too.
    let lone = specs(lookup_or_model, DraftPolicy::Goodput);
    for (spec, want) in lone.iter().zip(&want).take(2) {
        let got = alone(&model, &providers, spec).expect("alone");
        assert_eq!(got.tokens, want.0);
    }
}

#[test]
fn seeded_sampling_batches_equal_each_request_alone() {
    let (_d, model) = model_dir(11);
    let (draft_dir, _) = model_dir(12);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    let drafter = build(
        "draft-model",
        &model,
        ProviderOptions::from([("model", draft_dir.path().to_string_lossy().into_owned())]),
    );
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref(), drafter.as_ref()];
    let sampled = |mut s: Spec, seed: u64, verify: VerifyMode| {
        s.temperature = 0.8;
        s.seed = seed;
        s.verify = verify;
        s
    };
    let specs = vec![
        sampled(
            Spec::new(prompt(1, 10), 20, Some(1), 0),
            1,
            VerifyMode::Rejection,
        ),
        sampled(
            Spec::new(prompt(2, 21), 20, Some(0), 0),
            2,
            VerifyMode::ExactMatch,
        ),
        sampled(
            Spec::new(prompt(3, 6), 20, None, 1),
            3,
            VerifyMode::ExactMatch,
        ),
        sampled(
            Spec::new(prompt(4, 14), 20, Some(1), 3),
            4,
            VerifyMode::ExactMatch,
        ),
        sampled(
            Spec::new(prompt(5, 9), 20, Some(0), 3),
            5,
            VerifyMode::Rejection,
        ),
        Spec::new(prompt(6, 17), 20, Some(1), 4),
    ];
    check(&model, &providers, &specs);
}

#[test]
fn a_provider_failing_mid_round_fails_only_its_request() {
    let (_d, model) = model_dir(11);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    let failing = Probe {
        fail_at_draft: Some(3),
        ..Probe::new("probe-failing", PrefillMode::TailSplit, &[])
    };
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref(), &failing];
    let specs = vec![
        Spec::new(prompt(1, 12), 20, Some(0), 0),
        Spec::new(prompt(2, 10), 20, Some(1), 0),
        Spec::new(prompt(3, 11), 20, None, 1),
    ];
    let out = check(&model, &providers, &specs);
    match &out[1] {
        Err(ServeError::Source { provider, .. }) => assert_eq!(provider, "probe-failing"),
        other => panic!("expected the provider's failure, got {other:?}"),
    }
    let log = failing.log.borrow();
    assert_eq!(log.len(), 2, "batched and alone, each told once");
    assert!(log.iter().all(|(.., o)| *o == RequestOutcome::Failed));
}

/// A target whose prompt forward fails on any chunk holding `poison`.
#[derive(Debug)]
struct Poisoned {
    inner: LoadedModel,
    poison: u32,
}

impl Poisoned {
    fn check(&self, tokens: &Array) -> Result<(), SpecError> {
        let t = tokens.as_dtype(mlx_rs::Dtype::Uint32)?;
        t.eval()?;
        if t.as_slice::<u32>().contains(&self.poison) {
            return Err(SpecError::Model(
                format!("injected fault on token {}", self.poison).into(),
            ));
        }
        Ok(())
    }
}

impl Target for Poisoned {
    fn info(&self) -> &spec_core::TargetInfo {
        self.inner.info()
    }
    fn make_caches(&self) -> spec_core::CacheSet {
        self.inner.make_caches()
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut spec_core::CacheSet,
        taps: &[usize],
    ) -> Result<spec_core::TargetOutput, SpecError> {
        self.check(tokens)?;
        self.inner.forward(tokens, caches, taps)
    }
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut spec_core::CacheSet,
        taps: &[usize],
    ) -> Result<spec_core::TargetOutput, SpecError> {
        self.inner.decode(tokens, caches, taps)
    }
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.inner.logits(hidden)
    }
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        self.inner.embed(tokens)
    }
    fn weights_bytes(&self) -> usize {
        self.inner.weights_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn a_failing_row_in_a_batched_forward_fails_only_its_request() {
    let (_d, inner) = model_dir(11);
    // Token 95 occurs only in the second chunk of request 1's prompt: its
    // row fails in a step shared with decoding rows (that already appended
    // to their caches when the default batched forward reaches it).
    let model = Poisoned { inner, poison: 95 };
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref()];
    let mut poisoned = prompt(2, 20);
    poisoned.iter_mut().for_each(|t| *t %= 90);
    poisoned[12] = 95;
    let specs = vec![
        Spec::new(prompt(1, 6), 30, Some(0), 0),
        Spec::new(poisoned, 20, None, 3),
        Spec::new(prompt(3, 7), 30, None, 0),
    ];
    let out = check(&model, &providers, &specs);
    assert!(out[0].is_ok() && out[2].is_ok());
    let err = out[1].as_ref().expect_err("the poisoned request fails");
    assert!(err.to_string().contains("injected fault"), "{err}");
}

#[test]
fn goodput_never_skips_a_round_of_a_source_that_must_see_every_round() {
    // DeepSpec's context takes the taps of every verified window: a round
    // the policy cut to zero drafts, if the source were not asked, would
    // leave it a row short. Dear tokens cut most drafts; the output must
    // still be plain decoding's, with no protocol error.
    use draft_deepspec as _;
    let target_dir = tempfile::tempdir().expect("tempdir");
    let drafter_dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_deepspec_pair(target_dir.path(), drafter_dir.path())
        .expect("write target and drafter");
    let model = load_model(target_dir.path(), &LoadOptions::default()).expect("load");
    let deepspec = build(
        "deepspec",
        &model,
        ProviderOptions::from([("model", drafter_dir.path().to_string_lossy().into_owned())]),
    );
    let providers: Vec<&dyn DraftProvider> = vec![deepspec.as_ref()];
    let specs = |provider: Option<usize>, policy| -> Vec<Spec> {
        (0..4u32)
            .map(|i| {
                let prompt = (0..9 + 4 * i).map(|t| (t * 5 + i * 7 + 1) % 64).collect();
                let mut s = Spec::new(prompt, 24, provider, i as usize);
                s.policy = policy;
                s
            })
            .collect()
    };
    let outputs = |out: &[Result<Output, ServeError>]| -> Vec<Vec<u32>> {
        out.iter()
            .map(|o| o.as_ref().expect("no protocol error").tokens.clone())
            .collect()
    };
    let (plain, _) = batched(&model, &providers, &specs(None, DraftPolicy::PerRow));
    let (goodput, most_rows) = batched_from(
        &model,
        &providers,
        &specs(Some(0), DraftPolicy::Goodput),
        primed(0.001, 0.050, 20),
    );
    assert!(most_rows >= 2);
    assert_eq!(outputs(&goodput), outputs(&plain));
}

/// A GLM-5.2-schema target with its routed experts streamed through a tier
/// of one layer's experts (a quarter of them all): many requests through
/// one scheduler, plain and with prompt lookup, rows of different lengths
/// joining at different steps, give the resident model's tokens and
/// log-probabilities bit for bit, batched and alone.
#[test]
fn a_streamed_glm_batch_equals_the_resident_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec_fixtures::glm::Glm::glm52_tiny();
    spec.write(dir.path()).expect("write model");
    let resident = load_model(dir.path(), &LoadOptions::default()).expect("resident");
    // gate, up and down of [32, 32] in float32.
    let layer = spec.experts * 3 * spec.moe_intermediate * spec.hidden * 4;
    let options = LoadOptions {
        expert_cache_bytes: Some(layer),
        ..LoadOptions::default()
    };
    let streamed = load_model(dir.path(), &options).expect("streamed");
    let lookup = build("prompt-lookup", &resident, ProviderOptions::new());
    let providers: Vec<&dyn DraftProvider> = vec![lookup.as_ref()];
    let specs = vec![
        Spec::new(prompt(1, 9), 12, None, 0),
        Spec::new(prompt(2, 27), 10, Some(0), 0),
        Spec::new(prompt(3, 5), 14, Some(0), 1),
        Spec::new(prompt(4, 19), 8, None, 3),
    ];
    let (want, _) = batched(&resident, &providers, &specs);
    let (got, most_rows) = batched(&streamed, &providers, &specs);
    assert!(most_rows >= 2, "some step must hold several rows");
    let bits = |o: &Output| o.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.as_ref().expect("streamed"), w.as_ref().expect("resident"));
        assert_eq!(g.tokens, w.tokens, "request {i}: tokens");
        assert_eq!(bits(g), bits(w), "request {i}: log-probabilities");
    }
    let lone = alone(&streamed, &providers, &specs[1]).expect("alone");
    assert_eq!(
        lone.tokens,
        want[1].as_ref().expect("resident").tokens,
        "alone"
    );
    let stats = spec_models::expert_store(&streamed)
        .expect("streamed")
        .stats();
    assert!(stats.bytes_read > stats.capacity_bytes, "the tier evicted");
}
