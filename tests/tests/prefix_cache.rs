//! The in-memory prefix cache through the scheduler: a chat's next turn
//! (request B = A's prompt, A's answer and a new user turn) starts from
//! what A left and gives the tokens, log-probabilities (bits), finish and
//! draft counts of B run cold. On split-invariant targets (llama, Gemma-4
//! with a sliding window the prefix has rotated) A leaves its prompt and
//! answer and B hits inside A's answer, off the prefill grid; a turn that
//! diverges inside A's answer hits there (trimmed). On GLM (whose prefill
//! is not split-invariant) and the hybrid Qwen models (recurrent states
//! copied at the grid) hits stay on the prefill grid, and a GLM that
//! claimed split invariance would differ from cold (the mutation check).
//! Plain and with each provider; a repeated prompt hits at its own
//! `len - 1`; a provider that reads tapped layers hits only within its own
//! saved state; the byte budget holds at every step.

use std::ops::ControlFlow;

use draft_gemma4_assistant as _;
use draft_glm52_mtp as _;
use draft_model as _;
use draft_prompt_lookup as _;
use draft_qwen3_mtp as _;
use mlx_rs::Array;
use mlx_spec_scenarios::Tapping;
use serve_loop::{
    AdaptiveConfig, Output, PrefixCacheConfig, ProviderChoice, Request, ScheduleConfig, Scheduler,
    SpecConfig,
};
use spec_core::{
    DraftProvider, DraftRequest, DraftSource, GreedySampler, ProviderOptions, SpecError, Target,
};
use spec_fixtures::glm::Glm;
use spec_models::{load_model, LoadOptions, LoadedModel};

const CHUNK: usize = 4;

fn schedule(chunk: usize) -> ScheduleConfig {
    ScheduleConfig {
        max_batch: 4,
        prefill_chunk: chunk,
        prefill_budget: 4096,
    }
}

/// Runs `prompts` one after another through one scheduler (the prefix
/// cache `cache`), each to its end; returns their outputs and the bytes
/// the cache held after every step.
fn turns(
    target: &dyn Target,
    provider: Option<&dyn DraftProvider>,
    prompts: &[Vec<u32>],
    cache: PrefixCacheConfig,
) -> (Vec<Output>, Vec<usize>, serve_loop::PrefixCacheStats) {
    turns_in(CHUNK, target, provider, prompts, cache)
}

fn turns_in(
    chunk: usize,
    target: &dyn Target,
    provider: Option<&dyn DraftProvider>,
    prompts: &[Vec<u32>],
    cache: PrefixCacheConfig,
) -> (Vec<Output>, Vec<usize>, serve_loop::PrefixCacheStats) {
    let mut scheduler = Scheduler::new(target, schedule(chunk))
        .expect("scheduler")
        .with_providers(provider.as_slice())
        .with_prefix_cache(cache);
    let mut outputs = Vec::new();
    let mut bytes = Vec::new();
    for prompt in prompts {
        let request = Request {
            speculation: provider.map(|provider| {
                let config = SpecConfig {
                    num_draft: 3,
                    adaptive: AdaptiveConfig::off(),
                    ..SpecConfig::default()
                };
                ProviderChoice::new(provider.id(), config)
            }),
            ..Request::new(prompt.clone(), 12)
        };
        scheduler
            .submit(request, |_| ControlFlow::Continue(()))
            .expect("submit");
        while !scheduler.is_idle() {
            for f in scheduler.step().finished {
                outputs.push(f.result.expect("request"));
            }
            bytes.push(scheduler.prefix_cache_stats().bytes);
        }
    }
    (outputs, bytes, scheduler.prefix_cache_stats())
}

fn bits(o: &Output) -> Vec<u32> {
    o.logprobs.iter().map(|l| l.to_bits()).collect()
}

/// A's prompt, then B: A's prompt, A's answer and a new turn.
fn chat(target: &dyn Target, provider: Option<&dyn DraftProvider>) -> Vec<Vec<u32>> {
    let a: Vec<u32> = [
        40, 41, 42, 43, 9, 9, 40, 41, 42, 7, 8, 40, 41, 42, 3, 5, 6, 2,
    ]
    .into_iter()
    .collect();
    let (first, _, _) = turns(
        target,
        provider,
        std::slice::from_ref(&a),
        PrefixCacheConfig::off(),
    );
    let mut b = a.clone();
    b.extend(&first[0].tokens);
    b.extend([11, 12, 40, 41, 13]);
    vec![a, b]
}

fn assert_same(name: &str, warm: &Output, cold: &Output) {
    assert_eq!(warm.tokens, cold.tokens, "{name}: tokens");
    assert_eq!(bits(warm), bits(cold), "{name}: log-probabilities");
    assert_eq!(warm.finish, cold.finish, "{name}: finish");
    assert_eq!(
        (warm.stats.drafted, warm.stats.accepted, warm.stats.rounds),
        (cold.stats.drafted, cold.stats.accepted, cold.stats.rounds),
        "{name}: acceptance"
    );
}

/// Checks that a hit at `at` took what A (a prompt of `prompt` tokens)
/// left: its prompt and its answer, but the last answer token when that
/// one never ran (it was pending when A ended at its max tokens).
fn assert_left(name: &str, prompt: usize, a: &Output, at: usize) {
    let all = prompt + a.tokens.len();
    assert!(
        at == all || at == all - 1,
        "{name}: B starts at {at}, not from what A left ({all} tokens)"
    );
}

/// B after A from the cache equals B cold, bit for bit. B hits inside A's
/// answer on a split-invariant target (A left its prompt and all its
/// answer but the last token, which never ran), else at the last grid
/// point of A's prompt body.
fn check(target: &dyn Target, name: &str, provider: Option<&dyn DraftProvider>) {
    let prompts = chat(target, provider);
    let (warm, _, stats) = turns(target, provider, &prompts, PrefixCacheConfig::default());
    let (cold, _, _) = turns(target, provider, &prompts[1..], PrefixCacheConfig::off());
    let (a, b) = (&warm[0], &warm[1]);
    let at = b.cached_tokens;
    if target.split_invariant() {
        assert_left(name, prompts[0].len(), a, at);
    } else {
        assert_eq!(
            at,
            (prompts[0].len() - 1) / CHUNK * CHUNK,
            "{name}: B on the grid"
        );
    }
    assert_eq!(a.cached_tokens, 0, "{name}: A starts cold");
    assert_eq!((stats.hits, stats.misses), (1, 1), "{name}");
    assert_eq!(stats.cached_tokens, at as u64, "{name}");
    let cold = &cold[0];
    assert_same(name, b, cold);
    // The same prompt again hits at its own `len - 1`.
    let again = vec![prompts[1].clone(), prompts[1].clone()];
    let (twice, _, _) = turns(target, provider, &again, PrefixCacheConfig::default());
    assert_eq!(
        twice[1].cached_tokens,
        prompts[1].len() - 1,
        "{name}: repeat"
    );
    assert_same(&format!("{name}: repeat"), &twice[1], cold);
    // A turn diverging inside A's answer: on a split-invariant target it
    // hits there when the caches trim to it (a rotated window does not:
    // then A's prompt snapshot serves it), else on the grid.
    let mut c = prompts[0].clone();
    c.extend(&a.tokens[..5]);
    c.extend([14, 15, 40, 41, 16, 17]);
    let (diverged, _, _) = turns(
        target,
        provider,
        &[prompts[0].clone(), c.clone()],
        PrefixCacheConfig::default(),
    );
    let (cold_c, _, _) = turns(target, provider, &[c], PrefixCacheConfig::off());
    let got = diverged[1].cached_tokens;
    assert!(got > 0, "{name}: the diverging turn hits");
    let fresh = target.make_caches();
    let windowed = (0..fresh.len()).any(|i| fresh.get(i).is_some_and(|c| c.window().is_some()));
    if !target.split_invariant() {
        assert_eq!(got % CHUNK, 0, "{name}: diverging turn on the grid");
    } else if !windowed {
        assert_eq!(got, prompts[0].len() + 5, "{name}: diverging turn");
    }
    assert_same(&format!("{name}: diverging turn"), &diverged[1], &cold_c[0]);
}

fn load(dir: &std::path::Path) -> LoadedModel {
    load_model(dir, &LoadOptions::default()).expect("load")
}

fn build(id: &str, model: &dyn Target, options: ProviderOptions) -> Box<dyn DraftProvider> {
    serve_loop::build_provider(id, model, &options).expect(id)
}

#[test]
fn llama_next_turn_from_the_prefix_cache_equals_a_cold_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, drafter_dir) = (dir.path().join("target"), dir.path().join("drafter"));
    for d in [&target_dir, &drafter_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    mlx_spec_scenarios::write_tiny_llama(&target_dir, 7).expect("write");
    mlx_spec_scenarios::write_tiny_llama(&drafter_dir, 8).expect("write");
    let model = load(&target_dir);
    check(&model, "llama plain", None);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    check(&model, "llama prompt-lookup", Some(lookup.as_ref()));
    let mut options = ProviderOptions::new();
    options.insert("model".into(), drafter_dir.to_string_lossy().into_owned());
    let drafter = build("draft-model", &model, options);
    check(&model, "llama draft-model", Some(drafter.as_ref()));
}

/// Keys and values kept quantized (`--kv-bits`): a prefix left by A and
/// trimmed to where a turn diverges serves B with a cold run's bits, off the
/// prefill grid (a quantized row is the same whichever forward wrote it).
#[test]
fn llama_with_quantized_kv_next_turn_from_the_prefix_cache_equals_a_cold_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama {
        head_dim: Some(32),
        ..spec_fixtures::llama::Llama::tiny(7)
    }
    .write(dir.path())
    .expect("write");
    let options = LoadOptions {
        kv_quantization: Some(spec_runtime::cache::KvQuantization::new(4, 32, 20).expect("params")),
        ..LoadOptions::default()
    };
    let model = load_model(dir.path(), &options).expect("load");
    assert!(model.split_invariant());
    check(&model, "llama kv4 plain", None);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    check(&model, "llama kv4 prompt-lookup", Some(lookup.as_ref()));
}

#[test]
fn gemma4_next_turn_past_the_window_equals_a_cold_run() {
    use mlx_spec_scenarios::{
        write_tiny_assistant, write_tiny_gemma4, AssistantHead, Gemma4Variant,
    };
    const WINDOW: usize = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, assistant_dir) = (dir.path().join("target"), dir.path().join("assistant"));
    for d in [&target_dir, &assistant_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    write_tiny_gemma4(&target_dir, 5, Gemma4Variant::Text, WINDOW).expect("write");
    write_tiny_assistant(&assistant_dir, 3, AssistantHead::Tied, 64, 96, WINDOW).expect("write");
    let model = load(&target_dir);
    check(&model, "gemma4 plain", None);
    let mut options = ProviderOptions::new();
    options.insert("model".into(), assistant_dir.to_string_lossy().into_owned());
    let assistant = build("gemma4-assistant", &model, options);
    check(&model, "gemma4 assistant", Some(assistant.as_ref()));
}

#[test]
fn glm_next_turn_on_the_prefill_grid_equals_a_cold_run() {
    for spec in [Glm::default(), Glm::glm52_tiny()] {
        let dir = tempfile::tempdir().expect("tempdir");
        spec.write(dir.path()).expect("write");
        let model = load(dir.path());
        check(&model, "glm plain", None);
        let mtp = build("glm52-native-mtp", &model, ProviderOptions::new());
        check(&model, "glm mtp", Some(mtp.as_ref()));
    }
}

#[test]
fn hybrid_next_turn_on_the_prefill_grid_equals_a_cold_run() {
    // Recurrent states copied at the grid serve the next turn exactly,
    // plainly and with every provider (a hybrid draft model too: its own
    // saved caches are copies that serve their own length only).
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, drafter_dir) = (dir.path().join("target"), dir.path().join("drafter"));
    for d in [&target_dir, &drafter_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    spec_fixtures::qwen3_next::GATE
        .tiny(9)
        .write(&target_dir)
        .expect("write");
    spec_fixtures::qwen3_next::GATE_QWEN3_5
        .tiny(10)
        .write(&drafter_dir)
        .expect("write");
    let model = load(&target_dir);
    assert!(!model.split_invariant());
    check(&model, "hybrid plain", None);
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    check(&model, "hybrid prompt-lookup", Some(lookup.as_ref()));
    let mut options = ProviderOptions::new();
    options.insert("model".into(), drafter_dir.to_string_lossy().into_owned());
    let drafter = build("draft-model", &model, options);
    check(&model, "hybrid draft-model", Some(drafter.as_ref()));
}

/// GLM claiming a split invariance it does not have.
#[derive(Debug)]
struct Claiming<'a>(&'a dyn Target);

impl Target for Claiming<'_> {
    fn info(&self) -> &spec_core::TargetInfo {
        self.0.info()
    }
    fn make_caches(&self) -> spec_core::CacheSet {
        self.0.make_caches()
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut spec_core::CacheSet,
        taps: &[usize],
    ) -> Result<spec_core::TargetOutput, SpecError> {
        self.0.forward(tokens, caches, taps)
    }
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut spec_core::CacheSet,
        taps: &[usize],
    ) -> Result<spec_core::TargetOutput, SpecError> {
        self.0.decode(tokens, caches, taps)
    }
    fn forward_batch(
        &self,
        rows: &mut [spec_core::BatchRow<'_>],
        taps: &[usize],
    ) -> Result<spec_core::BatchOutput, SpecError> {
        self.0.forward_batch(rows, taps)
    }
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.0.logits(hidden)
    }
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        self.0.embed(tokens)
    }
    fn weights_bytes(&self) -> usize {
        self.0.weights_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.0.as_any()
    }
    fn split_invariant(&self) -> bool {
        true
    }
}

/// The mutation check of the grid rule: the same GLM claiming split
/// invariance takes B's hit inside A's answer, and B then differs from
/// its cold run; the real GLM (above) hits on the grid and does not.
#[test]
fn glm_claiming_split_invariance_would_not_be_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    Glm::default().write(dir.path()).expect("write");
    let model = load(dir.path());
    let lying = Claiming(&model);
    let prompts = chat(&lying, None);
    let (warm, _, _) = turns(&lying, None, &prompts, PrefixCacheConfig::default());
    let (cold, _, _) = turns(&lying, None, &prompts[1..], PrefixCacheConfig::off());
    assert!(
        warm[1].cached_tokens > prompts[0].len(),
        "B hits inside A's answer"
    );
    assert_ne!(
        bits(&warm[1]),
        bits(&cold[0]),
        "an off-grid hit on GLM gave a cold run's bits"
    );
}

#[test]
fn a_tapping_provider_never_hits_and_the_byte_budget_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write");
    let model = load(dir.path());
    let prompts = chat(&model, None);
    let (out, _, stats) = turns(
        &model,
        Some(&Tapping),
        &prompts,
        PrefixCacheConfig::default(),
    );
    // Its source saves nothing: the entries A left serve it nothing.
    assert!(out.iter().all(|o| o.cached_tokens == 0));
    assert_eq!(stats.hits, 0);
    // The budget: measure one prompt's snapshot, allow a little more than
    // two, run five distinct conversations; the bytes never pass it.
    let (_, _, one) = turns(&model, None, &prompts[..1], PrefixCacheConfig::default());
    let budget = one.bytes + one.bytes / 2;
    let config = PrefixCacheConfig {
        max_bytes: budget,
        max_entries: 8,
        share_tenants: false,
    };
    let many: Vec<Vec<u32>> = (0..5u32)
        .map(|k| prompts[1].iter().map(|t| (t + 3 * k) % 60).collect())
        .collect();
    let (_, bytes, stats) = turns(&model, None, &many, config);
    assert!(
        bytes.iter().all(|&b| b <= budget),
        "bytes {bytes:?} past {budget}"
    );
    assert!(stats.evictions > 0, "{stats:?}");
    assert!(stats.entries >= 1, "{stats:?}");
}

fn draft_bits(source: &mut dyn DraftSource, prompt: &[u32]) -> (Vec<u32>, Option<Vec<u32>>) {
    let feed = [prompt[prompt.len() - 1]];
    let request = DraftRequest {
        feed: &feed,
        max_tokens: 4,
        anchor_hidden: None,
        history: prompt,
        target_caches: None,
    };
    let draft = source.draft(request, &mut GreedySampler).expect("draft");
    let probs = draft
        .probs
        .map(|p| p.as_slice::<f32>().iter().map(|v| v.to_bits()).collect());
    (draft.tokens, probs)
}

/// `draft-model` saves its cache after prefill and a later source starts
/// from it (kept to the drafter's own 2048-token grid, the rest prefilled
/// on it): its drafts are those of a cold prefill; a next turn past 2048
/// tokens through the scheduler (a hit at all of A's 2100 tokens) restores
/// it and equals a cold run. The state persisted to a file (written on
/// another thread) and read back drafts the same.
#[test]
fn draft_model_restores_its_prefill_and_drafts_as_a_cold_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, drafter_dir) = (dir.path().join("target"), dir.path().join("drafter"));
    for d in [&target_dir, &drafter_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    mlx_spec_scenarios::write_tiny_llama(&target_dir, 7).expect("write");
    mlx_spec_scenarios::write_tiny_llama(&drafter_dir, 8).expect("write");
    let model = load(&target_dir);
    let mut options = ProviderOptions::new();
    options.insert("model".into(), drafter_dir.to_string_lossy().into_owned());
    let provider = build("draft-model", &model, options);
    let a: Vec<u32> = (0..2100u32).map(|i| (i * 7 + i / 11) % 90 + 1).collect();
    let mut b = a.clone();
    b.extend([5, 6, 7, 8, 9, 40, 41]);
    let mut first = provider.open(&model).expect("open");
    first.prefill(&a, None).expect("prefill");
    let saved = first.save_prefill().expect("saved");
    assert_eq!(saved.tokens(), a.len() - 1);
    let mut warm = provider.open(&model).expect("open");
    assert!(warm
        .prefill_from(saved.as_ref(), 2048, &b, None)
        .expect("prefill_from"));
    let mut cold = provider.open(&model).expect("open");
    cold.prefill(&b, None).expect("prefill");
    assert_eq!(draft_bits(warm.as_mut(), &b), draft_bits(cold.as_mut(), &b));
    // Below the drafter's grid nothing can be kept: the host prefills.
    let mut short = provider.open(&model).expect("open");
    assert!(!short
        .prefill_from(saved.as_ref(), 2047, &b, None)
        .expect("prefill_from"));
    // Persisted (a prompt-cache file of the drafter) and read back, as
    // after a server restart: the same drafts again; a state for other
    // tokens is not taken.
    let persisted = saved
        .persist()
        .expect("draft-model persists its state")
        .expect("encode");
    let file = dir.path().join("state.draft.safetensors");
    let to = file.clone();
    std::thread::spawn(move || persisted.write(&to).expect("write"))
        .join()
        .expect("writer thread");
    let restored = provider
        .load_saved(&file, &a)
        .expect("read")
        .expect("its own state");
    assert_eq!(restored.tokens(), saved.tokens());
    let mut reread = provider.open(&model).expect("open");
    assert!(reread
        .prefill_from(restored.as_ref(), 2048, &b, None)
        .expect("prefill_from"));
    let mut cold = provider.open(&model).expect("open");
    cold.prefill(&b, None).expect("prefill");
    assert_eq!(
        draft_bits(reread.as_mut(), &b),
        draft_bits(cold.as_mut(), &b)
    );
    assert!(provider.load_saved(&file, &b[1..]).expect("read").is_none());
    // Through the scheduler: B from the cache equals B cold.
    let prompts = vec![a.clone(), b.clone()];
    let p = Some(provider.as_ref());
    let (warm, _, stats) = turns_in(512, &model, p, &prompts, PrefixCacheConfig::default());
    let (cold, _, _) = turns_in(512, &model, p, &prompts[1..], PrefixCacheConfig::off());
    // The target hits at all of A's prompt (split-invariant); the drafter
    // keeps its own grid point below it, 2048.
    assert_eq!(warm[1].cached_tokens, a.len());
    assert_eq!(stats.hits, 1);
    assert_eq!(warm[1].tokens, cold[0].tokens);
    assert_eq!(bits(&warm[1]), bits(&cold[0]));
    assert_eq!(
        (warm[1].stats.drafted, warm[1].stats.accepted),
        (cold[0].stats.drafted, cold[0].stats.accepted)
    );
}

/// The real model (SmolLM2-135M-Instruct, float32), run by gate
/// `prefix-cache` with `MLX_SPEC_PREFIX_CACHE_MODEL` naming its directory:
/// a chat's next turn from the cache, a hit inside the first answer (off
/// the prefill grid of 16), equals the cold run, plain and with prompt
/// lookup.
#[test]
#[ignore = "needs the real model: gate prefix-cache runs it"]
fn real_model_next_turn_from_the_prefix_cache_equals_a_cold_run() {
    let dir = std::env::var_os("MLX_SPEC_PREFIX_CACHE_MODEL")
        .expect("MLX_SPEC_PREFIX_CACHE_MODEL names the real model's directory");
    let model = load(std::path::Path::new(&dir));
    let lookup = build("prompt-lookup", &model, ProviderOptions::new());
    for (name, provider) in [("plain", None), ("prompt-lookup", Some(lookup.as_ref()))] {
        let a: Vec<u32> = (0..45u32).map(|i| 100 + (i * 37) % 900).collect();
        let (first, _, _) = turns_in(
            16,
            &model,
            provider,
            std::slice::from_ref(&a),
            PrefixCacheConfig::off(),
        );
        let mut b = a.clone();
        b.extend(&first[0].tokens);
        b.extend([200, 300, 400, 500, 600]);
        let prompts = vec![a, b];
        let (warm, _, stats) =
            turns_in(16, &model, provider, &prompts, PrefixCacheConfig::default());
        let (cold, _, _) = turns_in(
            16,
            &model,
            provider,
            &prompts[1..],
            PrefixCacheConfig::off(),
        );
        assert_left(name, prompts[0].len(), &first[0], warm[1].cached_tokens);
        assert_eq!(stats.hits, 1, "{name}");
        assert_eq!(warm[1].tokens, cold[0].tokens, "{name}: tokens");
        assert_eq!(bits(&warm[1]), bits(&cold[0]), "{name}: log-probabilities");
        assert_eq!(
            (warm[1].stats.drafted, warm[1].stats.accepted),
            (cold[0].stats.drafted, cold[0].stats.accepted),
            "{name}: acceptance"
        );
    }
}
