//! The EAGLE-3 provider on a random head drawn for a four-layer llama
//! target: what it refuses, the prefill and commit arithmetic, foreign
//! tokens, rollback on failure, misuse, and losslessness through the serve
//! loop.

use std::ops::ControlFlow;
use std::path::Path;

use draft_eagle3::{Eagle3Provider, Eagle3Source, Options, ID};
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use serve_loop::{generate, AdaptiveConfig, ProviderChoice, Request, SpecConfig};
use spec_core::{
    CacheSet, CommitInfo, DraftProvider, DraftRequest, DraftSource, GreedySampler, PrefillMode,
    Sampler, SamplerConfig, SpecError, Target,
};
use spec_fixtures::eagle3::{Eagle3Head, GATE, TARGET};
use spec_models::llama::Model;
use spec_models::{DtypePolicy, LoadOptions};

fn target() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    TARGET.write(dir.path()).expect("write target");
    let model = Model::load(dir.path(), &LoadOptions::default()).expect("load");
    (dir, model)
}

fn head(spec: Eagle3Head) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("write head");
    dir
}

fn provider(target: &Model, dir: &Path) -> Result<Eagle3Provider, SpecError> {
    Eagle3Provider::new(
        target,
        &Options {
            model: dir.to_path_buf(),
            dtype: DtypePolicy::Keep,
        },
    )
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

struct Driver<'m> {
    model: &'m Model,
    caches: CacheSet,
    pending: u32,
}

impl<'m> Driver<'m> {
    fn new(model: &'m Model, source: &mut Eagle3Source<'_>, prompt: &[u32]) -> Self {
        let mut caches = model.make_caches();
        let out = model
            .forward(&ids(prompt), &mut caches, source.tap_layers())
            .expect("prefill");
        source
            .prefill(prompt, out.taps.as_ref())
            .expect("source prefill");
        let pending = *greedy(model, &out.hidden.index((.., -1.., ..)))
            .last()
            .expect("token");
        Self {
            model,
            caches,
            pending,
        }
    }

    fn draft(&mut self, source: &mut Eagle3Source<'_>, n: usize) -> Result<Vec<u32>, SpecError> {
        let feed = [self.pending];
        let request = DraftRequest {
            feed: &feed,
            max_tokens: n,
            anchor_hidden: None,
            history: &feed,
            target_caches: None,
        };
        Ok(source.draft(request, &mut GreedySampler)?.tokens)
    }

    fn commit(
        &mut self,
        source: &mut Eagle3Source<'_>,
        drafts: &[u32],
        kept: usize,
        foreign: &[u32],
    ) -> Result<(), SpecError> {
        let mut window = vec![self.pending];
        window.extend_from_slice(&drafts[..kept]);
        window.extend_from_slice(foreign);
        let taps = source.tap_layers().to_vec();
        let out = self
            .model
            .decode(&ids(&window), &mut self.caches, &taps)
            .expect("verify");
        let all = window.len() - 1;
        let next = greedy(self.model, &out.hidden)[all];
        let result = source.commit(CommitInfo {
            drafted: drafts.len(),
            accepted: kept,
            accepted_tokens: &drafts[..kept],
            foreign,
            next,
            verified_taps: out.taps.as_ref(),
            verified_hidden: &out.hidden,
        });
        self.pending = next;
        result
    }
}

#[test]
fn taps_the_layers_before_the_fused_inputs_and_declares_its_modes() {
    let (_t, model) = target();
    let dir = head(GATE);
    let p = provider(&model, dir.path()).expect("provider");
    assert_eq!(p.id(), ID);
    let source = p.open_native(&model).expect("open");
    assert_eq!(source.tap_layers(), [0, 1, 2]);
    assert_eq!(source.prefill_mode(), PrefillMode::Full);
    assert!(source.takes_foreign_tokens());
}

#[test]
fn refuses_a_head_that_does_not_fit_naming_the_key() {
    let (_t, model) = target();
    for (spec, key) in [
        (
            Eagle3Head {
                aux: [1, 2, 4],
                ..GATE
            },
            "eagle_aux_hidden_state_layer_ids",
        ),
        (
            Eagle3Head {
                aux: [0, 1, 2],
                ..GATE
            },
            "eagle_aux_hidden_state_layer_ids",
        ),
        (
            Eagle3Head {
                vocab: 400,
                draft_vocab: 96,
                ..GATE
            },
            "vocab_size",
        ),
    ] {
        let dir = head(spec);
        let e = provider(&model, dir.path()).expect_err(key);
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    // A d2t entry outside the vocabulary is a load error naming `d2t`.
    let dir = head(GATE);
    let mut tensors: Vec<_> = GATE
        .tensors()
        .iter()
        .map(|s| s.draw(GATE.seed, GATE.name))
        .collect();
    let [mut d2t, t2d] = GATE.maps();
    if let spec_fixtures::Data::I64(v) = &mut d2t.data {
        v[5] = 10_000;
    }
    tensors.extend([d2t, t2d]);
    spec_fixtures::write_tensors(&dir.path().join("model.safetensors"), &tensors).expect("write");
    let e = provider(&model, dir.path()).expect_err("d2t");
    assert!(e.to_string().contains("d2t"), "{e}");
    // A source opened on a target the head does not fit (another
    // vocabulary) is refused by `open`.
    let good = head(GATE);
    let p = provider(&model, good.path()).expect("provider");
    let small_dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama {
        layers: 4,
        ..spec_fixtures::llama::Llama::tiny(2)
    }
    .write(small_dir.path())
    .expect("write");
    let small = Model::load(small_dir.path(), &LoadOptions::default()).expect("load");
    let e = p.open_native(&small).expect_err("another vocabulary");
    assert!(e.to_string().contains("vocab_size"), "{e}");
}

#[test]
fn prefill_and_commit_keep_one_row_per_position() {
    let (_t, model) = target();
    let dir = head(Eagle3Head {
        fc_norm: true,
        embedding: true,
        ..GATE
    });
    let p = provider(&model, dir.path()).expect("provider");
    let mut source = p.open_native(&model).expect("open");
    let prompt = [3, 4, 5, 6, 7];
    let mut driver = Driver::new(&model, &mut source, &prompt);
    assert_eq!(source.cache_offset(), prompt.len() - 1);
    let drafts = driver.draft(&mut source, 3).expect("draft");
    assert_eq!(drafts.len(), 3);
    let logits = source.last_draft_logits().expect("logits");
    assert_eq!(logits.shape(), [3, GATE.draft_vocab as i32]);
    // Drafts are target ids the head can propose.
    let proposable: Vec<usize> = (0..GATE.draft_vocab).map(|i| GATE.target_id(i)).collect();
    assert!(drafts.iter().all(|d| proposable.contains(&(*d as usize))));
    driver.commit(&mut source, &drafts, 1, &[]).expect("commit");
    assert_eq!(source.cache_offset(), prompt.len() + 1);
    let drafts = driver.draft(&mut source, 4).expect("draft");
    driver.commit(&mut source, &drafts, 4, &[]).expect("commit");
    assert_eq!(source.cache_offset(), prompt.len() + 6);
    assert_eq!(source.cache_offset() + 1, driver.caches.offset());
}

#[test]
fn foreign_tokens_extend_the_cache_as_accepted_drafts_do() {
    let (_t, model) = target();
    let dir = head(GATE);
    let p = provider(&model, dir.path()).expect("provider");
    let prompt = [9, 8, 7, 6];
    let mut a = p.open_native(&model).expect("open");
    let mut da = Driver::new(&model, &mut a, &prompt);
    let drafts = da.draft(&mut a, 3).expect("draft");
    da.commit(&mut a, &drafts, 3, &[]).expect("commit");
    let mut b = p.open_native(&model).expect("open");
    let mut db = Driver::new(&model, &mut b, &prompt);
    let first = db.draft(&mut b, 3).expect("draft");
    assert_eq!(first, drafts);
    db.commit(&mut b, &first, 1, &drafts[1..]).expect("commit");
    assert_eq!(a.cache_offset(), b.cache_offset());
    let (ka, va) = a.cache_contents().expect("rows");
    let (kb, vb) = b.cache_contents().expect("rows");
    assert!(ka.eq_values(&kb).expect("eq") && va.eq_values(&vb).expect("eq"));
    // The next round drafts the same from both.
    assert_eq!(
        da.draft(&mut a, 3).expect("draft"),
        db.draft(&mut b, 3).expect("draft")
    );
}

#[test]
fn misuse_and_failures_leave_the_last_commit() {
    let (_t, model) = target();
    let dir = head(GATE);
    let p = provider(&model, dir.path()).expect("provider");
    let mut s = p.open_native(&model).expect("open");
    let request = DraftRequest {
        feed: &[1],
        max_tokens: 2,
        anchor_hidden: None,
        history: &[1],
        target_caches: None,
    };
    assert!(
        s.draft(request, &mut GreedySampler).is_err(),
        "before prefill"
    );
    assert!(s.prefill(&[1, 2], None).is_err(), "no taps");
    let mut driver = Driver::new(&model, &mut s, &[1, 2, 3]);
    let settled = s.cache_offset();
    let drafts = driver.draft(&mut s, 2).expect("draft");
    assert!(driver.draft(&mut s, 2).is_err(), "two drafts, no commit");
    // A commit without taps fails and rolls the round back.
    let hidden = Array::zeros::<f32>(&[1, 3, 64]).expect("zeros");
    let info = CommitInfo {
        drafted: 2,
        accepted: 1,
        accepted_tokens: &drafts[..1],
        foreign: &[],
        next: 0,
        verified_taps: None,
        verified_hidden: &hidden,
    };
    assert!(s.commit(info).is_err());
    assert_eq!(s.cache_offset(), settled);

    // A sampler failing mid-chain.
    struct Failing(usize);
    impl Sampler for Failing {
        fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError> {
            self.0 += 1;
            if self.0 == 2 {
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
        max_tokens: 3,
        anchor_hidden: None,
        history: &feed,
        target_caches: None,
    };
    assert!(s.draft(request, &mut Failing(0)).is_err());
    assert_eq!(s.cache_offset(), settled);
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

/// Through the serve loop: greedy speculative output equals plain output;
/// a sampled run drafts and is reproducible from its seed.
#[test]
fn speculative_output_equals_plain_output() {
    let (_t, model) = target();
    let dir = head(GATE);
    let p = provider(&model, dir.path()).expect("provider");
    for prompt in [vec![1u32], vec![4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]] {
        let plain = run(&model, None, &prompt, 24, SamplerConfig::default());
        let spec = run(&model, Some(&p), &prompt, 24, SamplerConfig::default());
        assert_eq!(plain.tokens, spec.tokens, "{prompt:?}");
        assert!(spec.stats.drafted > 0);
    }
    let sampled = SamplerConfig {
        temperature: 0.8,
        seed: 5,
        ..SamplerConfig::default()
    };
    let a = run(&model, Some(&p), &[4, 5, 6], 24, sampled.clone());
    let b = run(&model, Some(&p), &[4, 5, 6], 24, sampled);
    assert_eq!(a.tokens, b.tokens);
    assert!(a.stats.drafted > 0);
}

/// A prefix-cache start (the saved prompt rows of another request, then the
/// rest of this prompt's features) leaves the head as a cold prefill does,
/// bit for bit: a full hit and a partial one.
#[test]
fn a_saved_prefill_restores_what_a_cold_prefill_gives() {
    let (_t, model) = target();
    let dir = head(GATE);
    let p = provider(&model, dir.path()).expect("provider");
    let prompt: Vec<u32> = (0..14).map(|i| (i * 7 + 3) % 320).collect();
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

    // An earlier request: the first 9 tokens, then others.
    let mut earlier_prompt = prompt[..9].to_vec();
    earlier_prompt.extend([300, 301, 302, 303]);
    let mut earlier = p.open_native(&model).expect("open");
    earlier
        .prefill(&earlier_prompt, Some(&taps_of(&earlier_prompt)))
        .expect("earlier");
    let saved = earlier.save_prefill().expect("saved");
    assert_eq!(saved.tokens(), earlier_prompt.len());

    for (keep, from) in [
        (9usize, &saved),
        (prompt.len(), &{
            let mut same = p.open_native(&model).expect("open");
            same.prefill(&prompt, Some(&full)).expect("same");
            same.save_prefill().expect("saved")
        }),
    ] {
        let mut warm = p.open_native(&model).expect("open");
        let rest = (keep < prompt.len()).then(|| full.index((.., keep as i32.., ..)));
        assert!(warm
            .prefill_from(from.as_ref(), keep, &prompt, rest.as_ref())
            .expect("prefill_from"));
        let got = warm.cache_contents().expect("rows");
        assert_eq!(warm.cache_offset(), cold.cache_offset(), "keep {keep}");
        assert!(
            got.0.eq_values(&want.0).expect("eq") && got.1.eq_values(&want.1).expect("eq"),
            "keep {keep}: rows differ from a cold prefill"
        );
        // And it drafts what the cold source drafts.
        let feed = [5u32];
        let draft = |s: &mut Eagle3Source<'_>| {
            let request = DraftRequest {
                feed: &feed,
                max_tokens: 3,
                anchor_hidden: None,
                history: &feed,
                target_caches: None,
            };
            s.draft(request, &mut GreedySampler).expect("draft").tokens
        };
        let mut again = p.open_native(&model).expect("open");
        again.prefill(&prompt, Some(&full)).expect("cold");
        assert_eq!(draft(&mut again), draft(&mut warm), "keep {keep}");
    }
    // A state of another provider's kind is declined.
    let mut other = p.open_native(&model).expect("open");
    struct Foreign;
    impl spec_core::SavedDraft for Foreign {
        fn tokens(&self) -> usize {
            3
        }
        fn nbytes(&self) -> usize {
            0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    impl std::fmt::Debug for Foreign {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Foreign")
        }
    }
    assert!(!other
        .prefill_from(&Foreign, 3, &prompt, None)
        .expect("declined"));
}
