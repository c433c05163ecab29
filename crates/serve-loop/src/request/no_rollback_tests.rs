//! A target whose caches cannot roll back (a third party's model without
//! exact rollback, here a hybrid model whose caches are wrapped to refuse
//! every trim): every provider is refused before it opens, with an error
//! naming why, and plain decoding runs; a hybrid model's prefix-cache
//! entries (copies of its recurrent states) serve exactly the prompts a
//! cold run would prefill the same way.

use std::cell::Cell;
use std::ops::ControlFlow;

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use spec_core::{
    CacheSet, DraftProvider, DraftSource, LayerCache, SpecError, Target, TargetInfo, TargetOutput,
};
use spec_fixtures::qwen3_next::GATE;

use crate::{
    generate, Engine, EngineConfig, Event, Loaded, ProviderChoice, Request, ServeError, SpecConfig,
};

/// Counts its opens; never drafts.
struct Counting {
    opened: Cell<usize>,
}

impl DraftProvider for Counting {
    fn id(&self) -> &str {
        "counting"
    }
    fn open<'a>(&self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        self.opened.set(self.opened.get() + 1);
        Err(SpecError::Internal("a test provider that never drafts"))
    }
}

/// A cache that refuses to drop any token.
#[derive(Debug)]
struct Frozen(Box<dyn LayerCache>);

impl LayerCache for Frozen {
    fn offset(&self) -> usize {
        self.0.offset()
    }
    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array), SpecError> {
        self.0.update_and_fetch(k, v)
    }
    fn can_trim(&self, n: usize) -> bool {
        n == 0
    }
    fn can_trim_after(&self, _append: usize, n: usize) -> bool {
        n == 0
    }
    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        match n {
            0 => Ok(()),
            _ => Err(SpecError::Trim {
                requested: n,
                reason: "frozen".into(),
            }),
        }
    }
    fn nbytes(&self) -> usize {
        self.0.nbytes()
    }
    fn contents(&self) -> Option<(Array, Array)> {
        self.0.contents()
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        self.0.as_any_mut()
    }
}

/// A target whose caches are [`Frozen`] and whose forward fails on a
/// window holding token 95 (after the caches took it).
#[derive(Debug)]
struct Stuck(spec_models::LoadedModel);

impl Target for Stuck {
    fn info(&self) -> &TargetInfo {
        self.0.info()
    }
    fn make_caches(&self) -> CacheSet {
        let layers = self.0.make_caches().into_layers();
        CacheSet::new(
            layers
                .into_iter()
                .map(|c| Box::new(Frozen(c)) as Box<dyn LayerCache>)
                .collect(),
        )
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        let out = self.0.forward(tokens, caches, taps)?;
        let ids = tokens.as_dtype(mlx_rs::Dtype::Uint32)?;
        ids.eval()?;
        if ids.as_slice::<u32>().contains(&95) {
            return Err(SpecError::Model("injected fault".into()));
        }
        Ok(out)
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
        self
    }
}

/// Greedy decoding by hand: one forward per token.
fn greedy(target: &dyn Target, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut caches = target.make_caches();
    let mut input = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let ids = Array::from_slice(&input, &[1, input.len() as i32]);
        let hidden = target
            .forward(&ids, &mut caches, &[])
            .expect("forward")
            .hidden;
        let logits = target.logits(&hidden).expect("logits");
        let last = logits.index((0, -1));
        let token = argmax_axis(&last, -1, None).expect("argmax");
        token.eval().expect("eval");
        let t = token.as_slice::<u32>()[0];
        out.push(t);
        input = vec![t];
    }
    out
}

#[test]
fn every_provider_is_refused_before_it_opens_and_plain_decoding_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(11).write(dir.path()).expect("fixture");
    let model = spec_models::load_model(dir.path(), &Default::default()).expect("load");
    let target = Stuck(model);
    let provider = Counting {
        opened: Cell::new(0),
    };
    let prompt = vec![3, 14, 15, 92, 65];
    let mut spec = Request::new(prompt.clone(), 6);
    spec.speculation = Some(ProviderChoice::new("counting", SpecConfig::default()));
    let err = generate(&target, &[&provider], spec, |_| ControlFlow::Continue(()))
        .expect_err("speculated on recurrent caches");
    assert!(
        matches!(&err, ServeError::NoRollback { provider, model_type, cache: 0 }
            if provider == "counting" && model_type == "qwen3_next"),
        "{err}"
    );
    assert!(
        err.to_string().contains("cannot roll back rejected drafts"),
        "{err}"
    );
    assert_eq!(provider.opened.get(), 0, "refused before opening");

    let plain = generate(
        &target,
        &[&provider],
        Request::new(prompt.clone(), 12),
        |_| ControlFlow::Continue(()),
    )
    .expect("plain decoding");
    assert_eq!(plain.tokens, greedy(&target, &prompt, 12));
}

#[test]
fn the_engine_reuses_a_hybrid_models_prompt_snapshots_exactly() {
    // Recurrent states are copied at the prefill grid (chunks of 4) and at
    // the prompt's end: a repeated prompt, and one sharing the first grid
    // points, start from them and decode what a cold run decodes.
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(11).write(dir.path()).expect("fixture");
    let path = dir.path().to_path_buf();
    let start = |cache: bool| {
        let path = path.clone();
        let mut config = EngineConfig::default();
        config.schedule.prefill_chunk = 4;
        config.schedule.prefill_budget = 4;
        if !cache {
            config.prefix_cache = crate::PrefixCacheConfig::off();
        }
        Engine::start(config, move || {
            let target = spec_models::load_model(&path, &Default::default())?;
            Ok(Loaded {
                target: Box::new(target),
                providers: Vec::new(),
                factory: None,
                prefix_store: None,
            })
        })
        .expect("engine")
    };
    let run = |engine: &Engine, prompt: Vec<u32>| -> (Vec<u32>, usize) {
        let mut tokens = Vec::new();
        for event in engine.submit(Request::new(prompt, 8)).expect("submit") {
            match event {
                Event::Token { token, .. } => tokens.push(token),
                Event::Done(done) => return (tokens, done.output.cached_tokens),
                Event::Failed(e) => panic!("{e}"),
            }
        }
        panic!("no end event")
    };
    let prompt = vec![7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5];
    let mut other = prompt[..9].to_vec();
    other.extend([33, 34, 35]);
    let cold = start(false);
    let want = [run(&cold, prompt.clone()).0, run(&cold, other.clone()).0];
    cold.shutdown().expect("shutdown");
    let engine = start(true);
    assert_eq!(run(&engine, prompt.clone()), (want[0].clone(), 0));
    assert_eq!(
        run(&engine, prompt),
        (want[0].clone(), 10),
        "the prompt's end"
    );
    assert_eq!(run(&engine, other), (want[1].clone(), 8), "a grid point");
    engine.shutdown().expect("shutdown");
}

#[test]
fn a_row_whose_caches_cannot_return_to_a_failed_steps_start_fails_not_retried() {
    // Request B's second prompt chunk holds the poisoned token: the step it
    // shares with request A fails after A's caches took A's token. A's
    // caches cannot drop it, so A fails too, naming why, instead of running
    // that token twice (without the check, its retry would).
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(11).write(dir.path()).expect("fixture");
    let model = spec_models::load_model(dir.path(), &Default::default()).expect("load");
    let target = Stuck(model);
    let config = crate::ScheduleConfig {
        max_batch: 2,
        prefill_chunk: 4,
        prefill_budget: 8,
    };
    let mut scheduler = crate::Scheduler::new(&target, config).expect("scheduler");
    let a = scheduler
        .submit(Request::new(vec![3, 14, 15], 12), |_| {
            ControlFlow::Continue(())
        })
        .expect("a");
    let mut results = Vec::new();
    for step in 0..40 {
        if step == 2 {
            let b = vec![7, 1, 8, 2, 8, 95, 8, 2];
            scheduler
                .submit(Request::new(b, 4), |_| ControlFlow::Continue(()))
                .expect("b");
        }
        results.extend(scheduler.step().finished);
        if step > 2 && scheduler.is_idle() {
            break;
        }
    }
    assert_eq!(results.len(), 2);
    let of_a = results.iter().find(|f| f.id == a).expect("a ended");
    let err = of_a.result.as_ref().expect_err("a cannot be retried");
    assert!(err.to_string().contains("could not roll back"), "{err}");
    // B's caches took its chunk too: it fails the same way.
    let of_b = results.iter().find(|f| f.id != a).expect("b ended");
    let err = of_b.result.as_ref().expect_err("b is poisoned");
    assert!(err.to_string().contains("could not roll back"), "{err}");
}
