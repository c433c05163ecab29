//! The native MTP provider on tiny random GLM checkpoints: what it refuses,
//! the commit arithmetic, rollback on failure, every misuse, persistence,
//! losslessness through the serve loop, and memory over 2,000 rounds.

use std::ops::ControlFlow;

use draft_glm52_mtp::{Glm52MtpProvider, Glm52MtpSource, ID};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use serve_loop::{generate, AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::{
    CacheSet, CommitInfo, DraftProvider, DraftRequest, DraftSource, GreedySampler, PrefillMode,
    ProviderOptions, Sampler, SpecError, Target,
};
use spec_fixtures::glm::Glm as TinyGlm;
use spec_models::glm::{GlmOptions, Model, MtpCache};
use spec_models::LoadOptions;

fn load(spec: &TinyGlm, glm: GlmOptions) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("write checkpoint");
    let model = Model::load_with(dir.path(), &LoadOptions::default(), glm).expect("load");
    (dir, model)
}

fn tiny() -> (tempfile::TempDir, Model) {
    load(&TinyGlm::default(), GlmOptions::default())
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

fn greedy(model: &Model, hidden: &Array) -> Vec<u32> {
    let logits = model.logits(hidden).expect("logits");
    argmax_axis(&logits, -1, None)
        .expect("argmax")
        .as_dtype(Dtype::Uint32)
        .expect("cast")
        .flatten(None, None)
        .expect("flat")
        .as_slice::<u32>()
        .to_vec()
}

/// A request driven by hand: the target state a serve loop would keep.
struct Driver<'m> {
    model: &'m Model,
    caches: CacheSet,
    anchor: Array,
    pending: u32,
    history: Vec<u32>,
}

impl<'m> Driver<'m> {
    fn new(model: &'m Model, prompt: &[u32]) -> Self {
        let mut caches = model.make_caches();
        let out = model
            .forward(&ids(prompt), &mut caches, &[])
            .expect("prefill");
        let anchor = out.hidden.index((.., -1.., ..));
        let pending = *greedy(model, &anchor).last().expect("token");
        Self {
            model,
            caches,
            anchor,
            pending,
            history: prompt.to_vec(),
        }
    }

    fn draft(&mut self, source: &mut Glm52MtpSource<'_>, n: usize) -> Result<Vec<u32>, SpecError> {
        let feed = [self.pending];
        let request = DraftRequest {
            feed: &feed,
            max_tokens: n,
            anchor_hidden: Some(&self.anchor),
            history: &self.history,
            target_caches: None,
        };
        Ok(source.draft(request, &mut GreedySampler)?.tokens)
    }

    /// Verifies `drafts`, accepts `k` of them (whatever the target says:
    /// the commit arithmetic does not depend on why), commits.
    fn verify_and_commit(
        &mut self,
        source: &mut Glm52MtpSource<'_>,
        drafts: &[u32],
        k: usize,
    ) -> Result<(), SpecError> {
        let mut window = vec![self.pending];
        window.extend_from_slice(drafts);
        let out = self
            .model
            .forward(&ids(&window), &mut self.caches, &[])
            .expect("verify");
        let next = greedy(self.model, &out.hidden)[k];
        let d = drafts.len();
        if k < d {
            self.caches.trim(d - k).expect("trim");
        }
        let result = source.commit(CommitInfo {
            drafted: d,
            accepted: k,
            accepted_tokens: &drafts[..k],
            foreign: &[],
            next,
            verified_taps: None,
            verified_hidden: &out.hidden,
        });
        self.anchor = out.hidden.index((.., k as i32..k as i32 + 1, ..));
        self.history.extend_from_slice(&window[..=k]);
        self.pending = next;
        result
    }
}

impl Driver<'_> {
    /// Verifies the first `kept` of `drafts` (a constraint refused the
    /// rest) followed by `foreign` (tokens it forced), accepts them all and
    /// commits, the foreign ones as the source's foreign tail.
    fn commit_with_foreign(
        &mut self,
        source: &mut Glm52MtpSource<'_>,
        drafts: &[u32],
        kept: usize,
        foreign: &[u32],
    ) -> Result<(), SpecError> {
        let mut window = vec![self.pending];
        window.extend_from_slice(&drafts[..kept]);
        window.extend_from_slice(foreign);
        let out = self
            .model
            .forward(&ids(&window), &mut self.caches, &[])
            .expect("verify");
        let all = window.len() - 1;
        let next = greedy(self.model, &out.hidden)[all];
        let result = source.commit(CommitInfo {
            drafted: drafts.len(),
            accepted: kept,
            accepted_tokens: &drafts[..kept],
            foreign,
            next,
            verified_taps: None,
            verified_hidden: &out.hidden,
        });
        self.anchor = out.hidden.index((.., all as i32..all as i32 + 1, ..));
        self.history.extend_from_slice(&window);
        self.pending = next;
        result
    }
}

fn provider(model: &Model) -> Glm52MtpProvider {
    Glm52MtpProvider::new(model, &ProviderOptions::new()).expect("provider")
}

#[test]
fn shares_the_target_weights_and_declares_its_modes() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    assert_eq!(p.id(), ID);
    let source = p.open(&model).expect("open");
    assert_eq!(source.prefill_mode(), PrefillMode::Full);
}

#[test]
fn refuses_models_without_a_usable_mtp_row() {
    let check = |model: &Model, needle: &str| {
        let err = Glm52MtpProvider::new(model, &ProviderOptions::new())
            .expect_err("must refuse")
            .to_string();
        assert!(err.contains(needle) && err.contains(ID), "{err}");
    };
    let (_a, without) = load(
        &TinyGlm {
            mtp_rows: 0,
            ..TinyGlm::default()
        },
        GlmOptions::default(),
    );
    assert!(!without.capabilities().mtp_present);
    check(&without, "no complete MTP row");
    let (_b, disabled) = tiny_disabled();
    assert!(disabled.capabilities().mtp_present && !disabled.capabilities().mtp_enabled);
    check(&disabled, "disabled");
    let (_c, two) = load(
        &TinyGlm {
            mtp_rows: 2,
            nextn_layers: 2,
            ..TinyGlm::default()
        },
        GlmOptions::default(),
    );
    check(&two, "exactly one next-token layer");
    let dir = tempfile::tempdir().expect("tempdir");
    TinyGlm::default().write(dir.path()).expect("write");
    let streamed_options = LoadOptions {
        expert_cache_bytes: Some(1 << 20),
        ..LoadOptions::default()
    };
    let streamed = Model::load(dir.path(), &streamed_options).expect("streamed");
    check(&streamed, "`--mtp-expert-bits 8`");
    let other_bits = LoadOptions {
        mtp_expert_bits: Some(4),
        ..streamed_options.clone()
    };
    let err = Model::load(dir.path(), &other_bits)
        .expect_err("4 bits")
        .to_string();
    assert!(
        err.contains("--mtp-expert-bits") && err.contains("8 bits only"),
        "{err}"
    );
    let (_d, model) = tiny();
    let options = ProviderOptions::from([("gamma".to_owned(), "3".to_owned())]);
    assert!(Glm52MtpProvider::new(&model, &options)
        .expect_err("unknown option")
        .to_string()
        .contains("gamma"));
}

fn tiny_disabled() -> (tempfile::TempDir, Model) {
    load(&TinyGlm::default(), GlmOptions { load_mtp: false })
}

#[test]
fn an_incomplete_mtp_row_is_a_load_error_naming_the_tensor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = "model.layers.2.eh_proj.weight".to_owned();
    TinyGlm {
        omit: vec![missing.clone()],
        ..TinyGlm::default()
    }
    .write(dir.path())
    .expect("write");
    let err = Model::load(dir.path(), &LoadOptions::default())
        .expect_err("incomplete row")
        .to_string();
    assert!(err.contains(&missing), "{err}");
}

#[test]
fn refuses_a_different_target_than_it_was_built_for() {
    let (_a, one) = tiny();
    let (_b, other) = tiny();
    let p = provider(&one);
    assert!(p
        .open(&other)
        .err()
        .expect("other target")
        .to_string()
        .contains("different target"));
}

#[test]
fn commit_keeps_one_row_plus_the_accepted_pairs() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    let mut source = p.open_native(&model).expect("open");
    source.prefill(&[5, 6, 7], None).expect("prefill");
    assert_eq!(
        source.cache_offset(),
        0,
        "no prefill: the MTP cache starts empty"
    );
    let mut driver = Driver::new(&model, &[5, 6, 7]);
    let mut expected = 0;
    for (n, k) in [(3, 0), (3, 3), (2, 1), (1, 1), (4, 2), (1, 0)] {
        let drafts = driver.draft(&mut source, n).expect("draft");
        assert_eq!(drafts.len(), n);
        assert_eq!(
            source.cache_offset(),
            expected + n,
            "one row per draft step"
        );
        driver
            .verify_and_commit(&mut source, &drafts, k)
            .expect("commit");
        expected += 1 + k;
        assert_eq!(source.cache_offset(), expected, "after ({n}, {k})");
    }
    let bytes = source.cache_bytes();
    assert!(bytes > 0);
}

/// Tokens a host appends after the drafts (a constraint's forced tokens),
/// after all of them or in place of refused ones, leave the MTP cache bit
/// for bit as the same tokens drafted and accepted leave it.
#[test]
fn foreign_tokens_extend_the_cache_as_accepted_drafts_do() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    let prompt = [5, 6, 7];
    for (own, kept) in [(2, 2), (3, 1)] {
        let mut reference = p.open_native(&model).expect("open");
        let mut source = p.open_native(&model).expect("open");
        assert!(source.takes_foreign_tokens() && !source.syncs_from_history());
        let (mut a, mut b) = (Driver::new(&model, &prompt), Driver::new(&model, &prompt));
        for (s, d) in [(&mut reference, &mut a), (&mut source, &mut b)] {
            s.prefill(&prompt, None).expect("prefill");
            let warm = d.draft(s, 2).expect("draft");
            d.verify_and_commit(s, &warm, 1).expect("commit");
        }
        let all = a.draft(&mut reference, 4).expect("draft");
        a.verify_and_commit(&mut reference, &all, 4)
            .expect("commit");
        let drafts = b.draft(&mut source, own).expect("draft");
        assert_eq!(drafts[..kept], all[..kept], "the same chain");
        b.commit_with_foreign(&mut source, &drafts, kept, &all[kept..])
            .expect("commit with foreign tokens");
        assert_eq!(source.cache_offset(), reference.cache_offset());
        let (ours, theirs) = (
            source.cache_contents().expect("rows"),
            reference.cache_contents().expect("rows"),
        );
        assert!(
            ours.0.eq_values(&theirs.0).expect("eq") && ours.1.eq_values(&theirs.1).expect("eq"),
            "{own} drafted, {kept} kept: the cache differs"
        );
        // The next round drafts the same from both.
        assert_eq!(
            a.draft(&mut reference, 3).expect("draft"),
            b.draft(&mut source, 3).expect("draft")
        );
    }
}

#[test]
fn every_misuse_is_an_error() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    let mut source = p.open_native(&model).expect("open");
    source.prefill(&[1, 2], None).expect("prefill");
    assert!(source.prefill(&[1, 2], None).is_err(), "prefill twice");
    let mut driver = Driver::new(&model, &[1, 2]);
    let hidden = model.config().hidden;

    let no_commit = CommitInfo {
        drafted: 0,
        accepted: 0,
        accepted_tokens: &[],
        foreign: &[],
        next: 0,
        verified_taps: None,
        verified_hidden: &driver.anchor,
    };
    assert!(source
        .commit(no_commit)
        .expect_err("commit without draft")
        .to_string()
        .contains("without a draft"));

    let feed = [driver.pending];
    let no_anchor = DraftRequest {
        feed: &feed,
        max_tokens: 2,
        anchor_hidden: None,
        history: &[],
        target_caches: None,
    };
    assert!(
        source.draft(no_anchor, &mut GreedySampler).is_err(),
        "missing anchor"
    );
    let wide = Array::zeros::<f32>(&[1, 2, hidden]).expect("zeros");
    let bad_anchor = DraftRequest {
        feed: &feed,
        max_tokens: 2,
        anchor_hidden: Some(&wide),
        history: &[],
        target_caches: None,
    };
    assert!(source
        .draft(bad_anchor, &mut GreedySampler)
        .expect_err("anchor shape")
        .to_string()
        .contains("[1, 1,"));
    let empty = DraftRequest {
        feed: &[],
        max_tokens: 2,
        anchor_hidden: Some(&driver.anchor),
        history: &[],
        target_caches: None,
    };
    assert!(
        source.draft(empty, &mut GreedySampler).is_err(),
        "empty feed"
    );
    assert_eq!(source.cache_offset(), 0, "refused drafts append nothing");

    let drafts = driver.draft(&mut source, 2).expect("draft");
    assert!(driver
        .draft(&mut source, 2)
        .expect_err("draft twice")
        .to_string()
        .contains("before the previous round"));
    assert!(source.clone_cache().is_err(), "snapshot during a round");
    // Wrong drafted count, k > d, and an accepted list of the wrong length:
    // each is refused, rolls the round back and ends it.
    let anchor = driver.anchor.clone();
    for (d, k, tokens, needle) in [
        (3, 0, &[][..], "3 drafted"),
        (2, 3, &[1, 2, 3][..], "outside"),
        (2, 1, &[][..], "accepted tokens"),
    ] {
        let info = CommitInfo {
            drafted: d,
            accepted: k,
            accepted_tokens: tokens,
            foreign: &[],
            next: 0,
            verified_taps: None,
            verified_hidden: &anchor,
        };
        let err = source.commit(info).expect_err("misuse").to_string();
        assert!(err.contains(needle), "{err}");
        assert_eq!(source.cache_offset(), 0, "rolled back");
        let again = driver
            .draft(&mut source, 2)
            .expect("a new round after the failed commit");
        assert_eq!(again, drafts, "same state, same drafts");
    }
    source.close();
    assert!(driver
        .draft(&mut source, 1)
        .expect_err("closed")
        .to_string()
        .contains("closed"));
    assert!(source.clone_cache().is_err());
}

#[test]
fn a_failure_mid_round_rolls_back_everything_appended() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    let mut source = p.open_native(&model).expect("open");
    let mut driver = Driver::new(&model, &[3, 4, 5, 6]);
    let drafts = driver.draft(&mut source, 2).expect("draft");
    driver
        .verify_and_commit(&mut source, &drafts, 1)
        .expect("commit");
    let settled = source.cache_offset();
    let before = source.cache_contents().expect("rows");

    // The sampler fails on the third draft step.
    struct Failing(usize);
    impl Sampler for Failing {
        fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError> {
            self.0 += 1;
            if self.0 == 3 {
                return Err(SpecError::Internal("injected"));
            }
            GreedySampler.sample(logprobs)
        }
        fn is_greedy(&self) -> bool {
            true
        }
        fn probabilities(&self, logprobs: &Array) -> Result<Array, SpecError> {
            GreedySampler.probabilities(logprobs)
        }
    }
    let feed = [driver.pending];
    let request = DraftRequest {
        feed: &feed,
        max_tokens: 4,
        anchor_hidden: Some(&driver.anchor),
        history: &[],
        target_caches: None,
    };
    assert!(source.draft(request, &mut Failing(0)).is_err());
    assert_eq!(
        source.cache_offset(),
        settled,
        "the failed draft's rows are gone"
    );

    // A commit whose absorb fails (verified hidden of the wrong width).
    let drafts = driver.draft(&mut source, 3).expect("draft");
    let wrong = Array::zeros::<f32>(&[1, 4, 3]).expect("zeros");
    let info = CommitInfo {
        drafted: 3,
        accepted: 2,
        accepted_tokens: &drafts[..2],
        foreign: &[],
        next: 0,
        verified_taps: None,
        verified_hidden: &wrong,
    };
    assert!(source.commit(info).is_err());
    assert_eq!(
        source.cache_offset(),
        settled,
        "trim + failed absorb rolled back"
    );
    let after = source.cache_contents().expect("rows");
    assert!(after.0.eq_values(&before.0).expect("eq") && after.1.eq_values(&before.1).expect("eq"));
}

#[test]
fn the_mtp_cache_survives_clone_and_restore() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    let mut source = p.open_native(&model).expect("open");
    assert!(source.clone_cache().is_err(), "nothing to snapshot yet");
    let mut driver = Driver::new(&model, &[9, 8, 7, 6, 5]);
    for (n, k) in [(3, 2), (2, 2), (3, 0)] {
        let drafts = driver.draft(&mut source, n).expect("draft");
        driver
            .verify_and_commit(&mut source, &drafts, k)
            .expect("commit");
    }
    let snapshot = source.clone_cache().expect("snapshot");
    let mut restored = p.open_native(&model).expect("open");
    restored.restore_cache(snapshot.clone()).expect("restore");
    assert_eq!(restored.cache_offset(), source.cache_offset());
    assert!(restored
        .restore_cache(snapshot.clone())
        .expect_err("into a non-empty source")
        .to_string()
        .contains("empty source"));

    // Both continue identically; the snapshot is unaffected by either.
    let a = driver.draft(&mut source, 3).expect("draft a");
    let feed = [driver.pending];
    let request = DraftRequest {
        feed: &feed,
        max_tokens: 3,
        anchor_hidden: Some(&driver.anchor),
        history: &[],
        target_caches: None,
    };
    let b = restored
        .draft(request, &mut GreedySampler)
        .expect("draft b")
        .tokens;
    assert_eq!(a, b);
    assert_eq!(
        snapshot.contents().expect("rows").0.shape()[2] as usize,
        restored.cache_offset() - 3
    );
    assert_eq!(
        snapshot.indexer_keys().expect("indexer keys").shape()[2] as usize,
        snapshot.offset(),
        "the MTP indexer's keys travel with the snapshot"
    );

    let (kv, rope) = model.new_mtp_cache().geometry();
    for (cache, needle) in [
        (MtpCache::new(kv, rope, false), "indexer"),
        (MtpCache::new(kv + 1, rope, true), "geometry"),
        (model.new_mtp_cache(), "empty"),
    ] {
        let mut fresh = p.open_native(&model).expect("open");
        let err = fresh.restore_cache(cache).expect_err("refused").to_string();
        assert!(err.contains(needle), "{err}");
    }
}

fn run(
    model: &Model,
    provider: Option<&dyn DraftProvider>,
    prompt: &[u32],
    max_tokens: usize,
    eos: Option<u32>,
) -> serve_loop::Output {
    let speculation = provider.map(|provider| {
        let config = SpecConfig {
            num_draft: 3,
            adaptive: AdaptiveConfig::off(),
            ..SpecConfig::default()
        };
        ProviderChoice::new(provider.id(), config)
    });
    let request = Request {
        eos: eos.into_iter().collect(),
        speculation,
        ..Request::new(prompt.to_vec(), max_tokens)
    };
    let providers = provider.as_slice();
    generate(model, providers, request, |_| ControlFlow::Continue(())).expect("generate")
}

/// GLM-5's layout (an indexer on every layer and on the MTP row) and
/// GLM-5.2's (IndexShare, `index_share_for_mtp_iteration`, `index_topk` 4:
/// every prompt and the MTP cache run past it).
#[test]
fn speculative_output_equals_plain_output() {
    for spec in [TinyGlm::default(), TinyGlm::glm52_tiny()] {
        let (_dir, model) = load(&spec, GlmOptions::default());
        lossless_on(&model);
    }
}

/// A target streamed through a tier of one layer's experts, the MTP row's
/// experts resident at 8 bits (`--mtp-expert-bits 8`): the provider opens,
/// drafts, and the output equals plain decoding on the same target.
#[test]
fn a_streamed_target_with_8_bit_mtp_experts_speculates_losslessly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = TinyGlm::glm52_tiny();
    spec.write(dir.path()).expect("write");
    let layer = spec.experts * 3 * spec.moe_intermediate * spec.hidden * 4;
    let options = LoadOptions {
        expert_cache_bytes: Some(layer),
        mtp_expert_bits: Some(8),
        ..LoadOptions::default()
    };
    let model = Model::load(dir.path(), &options).expect("streamed, 8-bit MTP experts");
    assert_eq!(model.mtp_expert_bits(), Some(8));
    let (_d, float) = load(&spec, GlmOptions::default());
    assert_eq!(float.mtp_expert_bits(), None);
    assert!(model.mtp_weights_bytes() < float.mtp_weights_bytes());
    lossless_on(&model);
    assert!(model.expert_stats().expect("streamed").misses > 0);
}

fn lossless_on(model: &Model) {
    let p = provider(model);
    for (i, prompt) in [
        vec![1u32],
        vec![4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        vec![20, 21, 22],
    ]
    .iter()
    .enumerate()
    {
        let plain = run(model, None, prompt, 40, None);
        let spec = run(model, Some(&p), prompt, 40, None);
        assert_eq!(plain.tokens, spec.tokens, "prompt {i}");
        assert!(
            spec.stats.drafted > 0 && spec.stats.drafted_by_pos.len() == 3,
            "drafting happened, by position"
        );
        // EOS at a token the plain run emits mid-way ends both runs there.
        let eos = plain.tokens[17];
        let cut = plain
            .tokens
            .iter()
            .position(|&t| t == eos)
            .expect("present");
        let spec_eos = run(model, Some(&p), prompt, 40, Some(eos));
        assert_eq!(spec_eos.tokens, plain.tokens[..cut], "prompt {i}: EOS");
        for max in [1, 2, 5, 13] {
            assert_eq!(
                run(model, Some(&p), prompt, max, None).tokens,
                plain.tokens[..max],
                "prompt {i}: max {max}"
            );
        }
    }
}

/// 2,000 speculative rounds of one request, MLX active memory sampled after
/// warm-up and at the end: only the MTP cache's own rows may add memory.
/// With `index_topk` above the context the indexer's keys are written but
/// never read; their lazy updates used to pile up (~800 bytes a round here).
#[test]
fn memory_is_flat_over_2000_rounds() {
    let (_dir, model) = load(
        &TinyGlm {
            index_topk: 4096,
            ..TinyGlm::default()
        },
        GlmOptions::default(),
    );
    let p = provider(&model);
    let mut source = p.open_native(&model).expect("open");
    let mut driver = Driver::new(&model, &[1, 2, 3]);
    let round = |driver: &mut Driver<'_>, source: &mut Glm52MtpSource<'_>, r: usize| {
        let drafts = driver.draft(source, 2).expect("draft");
        // Alternate partial and full acceptance; keep the target short by
        // rolling it back (the point is the source's and loop's temporaries).
        let k = r % 3;
        let k = k.min(drafts.len());
        driver
            .verify_and_commit(source, &drafts, k)
            .expect("commit");
        let rewind = driver.caches.offset() - 3;
        driver.caches.trim(rewind).expect("rewind target");
        let mtp = source.cache_offset();
        (rewind, mtp)
    };
    let cache_rows = |source: &Glm52MtpSource<'_>| source.cache_bytes();
    for r in 0..100 {
        round(&mut driver, &mut source, r);
    }
    mlx_rs::transforms::eval([&driver.anchor]).expect("eval");
    let start = mlx_rs::memory::active_memory().expect("active memory");
    let start_cache = cache_rows(&source);
    for r in 100..2000 {
        round(&mut driver, &mut source, r);
    }
    mlx_rs::transforms::eval([&driver.anchor]).expect("eval");
    let end = mlx_rs::memory::active_memory().expect("active memory");
    let growth = end.saturating_sub(start);
    let cache_growth = cache_rows(&source) - start_cache;
    assert!(
        source.cache_offset() > 2000,
        "the MTP cache kept every committed row"
    );
    assert!(
        growth <= cache_growth + 64 * 1024,
        "active memory grew {growth} bytes, the MTP cache {cache_growth}"
    );
}

/// Colibri's rule through the serve loop's per-row controller: with random
/// MTP weights acceptance stays far below 10%, so drafting pauses after 24
/// proposals; acceptance by position is reported for the rounds that ran.
/// (The goodput policy, the default, may cut such drafts before the rule
/// sees 24 proposals.)
#[test]
fn low_acceptance_pauses_drafting() {
    let (_dir, model) = tiny();
    let p = provider(&model);
    let config = SpecConfig {
        num_draft: 3,
        adaptive: AdaptiveConfig::with_policy(serve_loop::DraftPolicy::PerRow),
        ..SpecConfig::default()
    };
    let prompt = [7u32, 8, 9];
    let request = Request {
        speculation: Some(ProviderChoice::new(p.id(), config)),
        ..Request::new(prompt.to_vec(), 80)
    };
    let out = generate(&model, &[&p], request, |_| ControlFlow::Continue(())).expect("generate");
    let s = &out.stats;
    assert!(
        s.acceptance_rate() < 0.10,
        "random MTP weights accept rarely ({})",
        s.acceptance_rate()
    );
    assert!(s.paused, "drafting paused");
    assert!(
        s.drafted >= 24 && s.drafted < 40,
        "paused soon after 24 proposals, drafted {}",
        s.drafted
    );
    assert_eq!(s.drafted_by_pos.iter().sum::<usize>(), s.drafted);
    assert_eq!(s.accepted_by_pos.iter().sum::<usize>(), s.accepted);
    assert_eq!(out.tokens, run(&model, None, &prompt, 80, None).tokens);
}
