//! The Qwen3 MTP provider on tiny random hybrid checkpoints (`qwen3_5`
//! dense and `qwen3_5_moe`, Hugging Face's layout with the `mtp.*` head):
//! what it refuses, the prefill and commit arithmetic, foreign tokens,
//! rollback on failure, every misuse, and losslessness through the serve
//! loop (greedy and sampled).

use std::ops::ControlFlow;

use draft_qwen3_mtp::{Qwen3MtpProvider, Qwen3MtpSource, ID};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use serve_loop::{generate, AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::{
    CacheSet, CommitInfo, DraftProvider, DraftRequest, DraftSource, GreedySampler, PrefillMode,
    ProviderOptions, Sampler, SamplerConfig, SpecError, Target,
};
use spec_fixtures::qwen3_next::{Qwen3Next, GATE, GATE_QWEN3_5, GATE_QWEN3_5_MOE};
use spec_models::qwen3_next::Model;
use spec_models::LoadOptions;

fn load(spec: Qwen3Next) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.tiny(0x51).write(dir.path()).expect("write checkpoint");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
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
    /// Prefills the target (tapping what `source` asks for) and `source`.
    fn new(model: &'m Model, source: &mut Qwen3MtpSource<'_>, prompt: &[u32]) -> Self {
        let mut caches = model.make_caches();
        let out = model
            .forward(&ids(prompt), &mut caches, source.tap_layers())
            .expect("prefill");
        source
            .prefill(prompt, out.taps.as_ref())
            .expect("source prefill");
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

    fn draft(&mut self, source: &mut Qwen3MtpSource<'_>, n: usize) -> Result<Vec<u32>, SpecError> {
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

    /// Verifies the first `kept` drafts followed by `foreign` tokens,
    /// accepts them all and commits (`foreign` as the source's foreign
    /// tail).
    fn commit(
        &mut self,
        source: &mut Qwen3MtpSource<'_>,
        drafts: &[u32],
        kept: usize,
        foreign: &[u32],
    ) -> Result<(), SpecError> {
        let mut window = vec![self.pending];
        window.extend_from_slice(&drafts[..kept]);
        window.extend_from_slice(foreign);
        let out = self
            .model
            .decode(&ids(&window), &mut self.caches, &[])
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

fn provider(model: &Model) -> Qwen3MtpProvider {
    Qwen3MtpProvider::new(model, &ProviderOptions::new()).expect("provider")
}

#[test]
fn declares_its_modes_and_taps_the_last_layer() {
    let (_dir, model) = load(GATE_QWEN3_5);
    let p = provider(&model);
    assert_eq!(p.id(), ID);
    let source = p.open_native(&model).expect("open");
    assert_eq!(source.prefill_mode(), PrefillMode::Full);
    assert!(source.takes_foreign_tokens());
    assert_eq!(source.tap_layers(), [GATE_QWEN3_5.layers - 1]);
    assert_eq!(source.cache_offset(), 0);
}

#[test]
fn refuses_targets_without_an_mtp_head() {
    // mlx-lm's qwen3_next layout carries no head.
    let (_dir, next) = load(GATE);
    let e = Qwen3MtpProvider::new(&next, &ProviderOptions::new()).expect_err("no head");
    assert!(e.to_string().contains("no MTP head"), "{e}");
    // Another architecture.
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama::tiny(3)
        .write(dir.path())
        .expect("write");
    let llama = spec_models::llama::Model::load(dir.path(), &LoadOptions::default()).expect("load");
    let e = Qwen3MtpProvider::new(&llama, &ProviderOptions::new()).expect_err("llama");
    assert!(e.to_string().contains("qwen3_next"), "{e}");
    // A source opened on another model than the provider's.
    let (_d2, model) = load(GATE_QWEN3_5);
    let (_d3, other) = load(GATE_QWEN3_5);
    assert!(provider(&model).open(&other).is_err());
    // Options it does not know.
    let options = ProviderOptions::from([("depth".to_owned(), "2".to_owned())]);
    assert!(Qwen3MtpProvider::new(&model, &options).is_err());
}

#[test]
fn an_mtp_head_with_a_missing_tensor_is_a_load_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = GATE_QWEN3_5.tiny(7);
    let tensors: Vec<_> = spec
        .tensors()
        .into_iter()
        .filter(|t| t.name != "mtp.pre_fc_norm_hidden.weight")
        .collect();
    spec_fixtures::write_checkpoint(dir.path(), &spec.config(), &tensors, spec.seed, spec.name)
        .expect("write");
    let e = Model::load(dir.path(), &LoadOptions::default()).expect_err("incomplete head");
    assert!(
        e.to_string().contains("mtp.pre_fc_norm_hidden.weight"),
        "{e}"
    );
}

#[test]
fn prefill_and_commit_keep_one_row_per_position() {
    for spec in [GATE_QWEN3_5, GATE_QWEN3_5_MOE] {
        let (_dir, model) = load(spec);
        let p = provider(&model);
        let mut source = p.open_native(&model).expect("open");
        let prompt = [3, 4, 5, 6, 7];
        let mut driver = Driver::new(&model, &mut source, &prompt);
        assert_eq!(source.cache_offset(), prompt.len() - 1, "{}", spec.name);
        // Three drafted, one accepted: the first row, then one pair.
        let drafts = driver.draft(&mut source, 3).expect("draft");
        assert_eq!(drafts.len(), 3);
        driver.commit(&mut source, &drafts, 1, &[]).expect("commit");
        assert_eq!(source.cache_offset(), prompt.len() + 1);
        // None accepted: the first row only.
        let drafts = driver.draft(&mut source, 2).expect("draft");
        driver.commit(&mut source, &drafts, 0, &[]).expect("commit");
        assert_eq!(source.cache_offset(), prompt.len() + 2);
        // All accepted.
        let drafts = driver.draft(&mut source, 4).expect("draft");
        driver.commit(&mut source, &drafts, 4, &[]).expect("commit");
        assert_eq!(source.cache_offset(), prompt.len() + 7);
        // Row j is position j: the target has seen one position more.
        assert_eq!(source.cache_offset() + 1, driver.caches.offset());
    }
}

/// Foreign tokens leave the head's rows as a round that drafted and
/// accepted the same tokens leaves them.
#[test]
fn foreign_tokens_extend_the_cache_as_accepted_drafts_do() {
    let (_dir, model) = load(GATE_QWEN3_5);
    let p = provider(&model);
    let prompt = [9, 8, 7, 6];
    // Reference: three drafts, all accepted.
    let mut a = p.open_native(&model).expect("open");
    let mut da = Driver::new(&model, &mut a, &prompt);
    let drafts = da.draft(&mut a, 3).expect("draft");
    da.commit(&mut a, &drafts, 3, &[]).expect("commit");
    // One draft kept, the other two arriving as foreign tokens.
    let mut b = p.open_native(&model).expect("open");
    let mut db = Driver::new(&model, &mut b, &prompt);
    let first = db.draft(&mut b, 3).expect("draft");
    assert_eq!(first, drafts);
    db.commit(&mut b, &first, 1, &drafts[1..]).expect("commit");
    assert_eq!(a.cache_offset(), b.cache_offset());
    let (ka, va) = a.cache_contents().expect("rows");
    let (kb, vb) = b.cache_contents().expect("rows");
    assert!(ka.eq_values(&kb).expect("eq"));
    assert!(va.eq_values(&vb).expect("eq"));
    assert_eq!(da.pending, db.pending);
}

#[test]
fn every_misuse_is_an_error() {
    let (_dir, model) = load(GATE_QWEN3_5);
    let p = provider(&model);
    // Draft before prefill; prefill without taps or with the wrong rows.
    let mut s = p.open_native(&model).expect("open");
    let anchor = Array::zeros::<f32>(&[1, 1, GATE_QWEN3_5.hidden as i32]).expect("zeros");
    let request = DraftRequest {
        feed: &[1],
        max_tokens: 2,
        anchor_hidden: Some(&anchor),
        history: &[1],
        target_caches: None,
    };
    assert!(s.draft(request, &mut GreedySampler).is_err());
    assert!(s.prefill(&[1, 2], None).is_err());
    let short = Array::zeros::<f32>(&[1, 1, GATE_QWEN3_5.hidden as i32]).expect("zeros");
    assert!(s.prefill(&[1, 2], Some(&short)).is_err());
    assert_eq!(s.cache_offset(), 0, "nothing appended");

    let mut s = p.open_native(&model).expect("open");
    let mut driver = Driver::new(&model, &mut s, &[1, 2, 3]);
    let taps = Array::zeros::<f32>(&[1, 3, GATE_QWEN3_5.hidden as i32]).expect("zeros");
    assert!(
        s.prefill(&[1, 2, 3], Some(&taps)).is_err(),
        "prefilled twice"
    );
    assert!(
        s.commit(CommitInfo {
            drafted: 0,
            accepted: 0,
            accepted_tokens: &[],
            foreign: &[],
            next: 0,
            verified_taps: None,
            verified_hidden: &anchor,
        })
        .is_err(),
        "commit without a draft"
    );
    // No anchor, a misshapen anchor, an empty feed.
    for (feed, anchor) in [
        (&[1u32][..], None),
        (&[1u32][..], Some(&taps)),
        (&[][..], Some(&driver.anchor)),
    ] {
        let request = DraftRequest {
            feed,
            max_tokens: 2,
            anchor_hidden: anchor,
            history: &[1, 2, 3],
            target_caches: None,
        };
        assert!(s.draft(request, &mut GreedySampler).is_err());
    }
    let drafts = driver.draft(&mut s, 2).expect("draft");
    assert!(driver.draft(&mut s, 2).is_err(), "two drafts, no commit");
    // Accepted beyond drafted.
    let info = CommitInfo {
        drafted: 2,
        accepted: 3,
        accepted_tokens: &[1, 2, 3],
        foreign: &[],
        next: 0,
        verified_taps: None,
        verified_hidden: &taps,
    };
    assert!(s.commit(info).is_err());
    assert_eq!(
        s.cache_offset(),
        2,
        "the failed commit rolled the round back"
    );
    let _ = drafts;
}

#[test]
fn a_failure_mid_round_rolls_back_everything_appended() {
    let (_dir, model) = load(GATE_QWEN3_5_MOE);
    let p = provider(&model);
    let mut source = p.open_native(&model).expect("open");
    let mut driver = Driver::new(&model, &mut source, &[3, 4, 5, 6]);
    let drafts = driver.draft(&mut source, 2).expect("draft");
    driver.commit(&mut source, &drafts, 1, &[]).expect("commit");
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
    assert!(after.0.eq_values(&before.0).expect("eq"));
    assert!(after.1.eq_values(&before.1).expect("eq"));
}

fn run(
    model: &Model,
    provider: Option<&dyn DraftProvider>,
    prompt: &[u32],
    max_tokens: usize,
    sampler: SamplerConfig,
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
        speculation,
        sampler,
        ..Request::new(prompt.to_vec(), max_tokens)
    };
    generate(model, provider.as_slice(), request, |_| {
        ControlFlow::Continue(())
    })
    .expect("generate")
}

/// Through the serve loop, dense and with experts: greedy speculative
/// output equals plain output token for token; a sampled run (rejection
/// sampling over the head's draft probabilities: the same distribution,
/// not the same tokens) drafts and is reproducible from its seed.
#[test]
fn speculative_output_equals_plain_output() {
    for spec in [GATE_QWEN3_5, GATE_QWEN3_5_MOE] {
        let (_dir, model) = load(spec);
        let p = provider(&model);
        for (i, prompt) in [vec![1u32], vec![4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
            .iter()
            .enumerate()
        {
            let greedy = SamplerConfig::default();
            let plain = run(&model, None, prompt, 24, greedy.clone());
            let spec_out = run(&model, Some(&p), prompt, 24, greedy);
            assert_eq!(plain.tokens, spec_out.tokens, "{} prompt {i}", spec.name);
            assert!(spec_out.stats.drafted > 0, "drafting happened");
        }
        let sampled = SamplerConfig {
            temperature: 0.8,
            seed: 11,
            ..SamplerConfig::default()
        };
        let a = run(&model, Some(&p), &[4, 5, 6], 24, sampled.clone());
        let b = run(&model, Some(&p), &[4, 5, 6], 24, sampled);
        assert_eq!(a.tokens.len(), 24);
        assert_eq!(a.tokens, b.tokens, "{}: reproducible", spec.name);
        assert!(a.stats.drafted > 0);
    }
}

/// A prefix-cache start (the saved prompt rows of another request, then the
/// rest of this prompt's taps) leaves the head as a cold prefill does, bit
/// for bit: a partial hit and a full one.
#[test]
fn a_saved_prefill_restores_what_a_cold_prefill_gives() {
    let (_dir, model) = load(GATE_QWEN3_5_MOE);
    let p = provider(&model);
    let prompt: Vec<u32> = (0..14).map(|i| (i * 7 + 3) % 96).collect();
    let taps_of = |tokens: &[u32]| {
        let mut caches = model.make_caches();
        let s = p.open_native(&model).expect("open");
        model
            .forward(&ids(tokens), &mut caches, s.tap_layers())
            .expect("forward")
            .taps
            .expect("taps")
    };
    let full = taps_of(&prompt);
    let mut cold = p.open_native(&model).expect("open");
    cold.prefill(&prompt, Some(&full)).expect("cold");
    let want = cold.cache_contents().expect("rows");

    let mut earlier_prompt = prompt[..9].to_vec();
    earlier_prompt.extend([90, 91, 92]);
    let mut earlier = p.open_native(&model).expect("open");
    earlier
        .prefill(&earlier_prompt, Some(&taps_of(&earlier_prompt)))
        .expect("earlier");
    let partial = earlier.save_prefill().expect("saved");
    let whole = cold.save_prefill().expect("saved");
    for (keep, saved) in [(9usize, &partial), (prompt.len(), &whole)] {
        let mut warm = p.open_native(&model).expect("open");
        let rest = (keep < prompt.len()).then(|| full.index((.., keep as i32.., ..)));
        assert!(warm
            .prefill_from(saved.as_ref(), keep, &prompt, rest.as_ref())
            .expect("prefill_from"));
        assert_eq!(warm.cache_offset(), cold.cache_offset(), "keep {keep}");
        let got = warm.cache_contents().expect("rows");
        assert!(
            got.0.eq_values(&want.0).expect("eq") && got.1.eq_values(&want.1).expect("eq"),
            "keep {keep}: rows differ from a cold prefill"
        );
    }
    // A prompt long enough that the expert layer sorts its picks: declined.
    let long: Vec<u32> = (0..40).map(|i| (i * 5 + 1) % 96).collect();
    let mut warm = p.open_native(&model).expect("open");
    let rest = taps_of(&long).index((.., 9.., ..));
    assert!(!warm
        .prefill_from(partial.as_ref(), 9, &long, Some(&rest))
        .expect("declined"));
}
