//! A target whose caches cannot roll back (a third party's model without
//! exact rollback, here a hybrid model whose caches are wrapped to refuse
//! every trim): every provider is refused before it opens, with an error
//! naming why, and plain decoding runs; a hybrid model itself decodes
//! through the engine with its prefix cache on (which keeps nothing it
//! could not copy).

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

/// A target whose caches are [`Frozen`].
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
        self.0.forward(tokens, caches, taps)
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
fn the_engine_decodes_a_hybrid_model_twice_with_its_prefix_cache_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(11).write(dir.path()).expect("fixture");
    let path = dir.path().to_path_buf();
    let engine = Engine::start(EngineConfig::default(), move || {
        let target = spec_models::load_model(&path, &Default::default())?;
        Ok(Loaded {
            target: Box::new(target),
            providers: Vec::new(),
            factory: None,
            prefix_store: None,
        })
    })
    .expect("engine");
    let run = |prompt: Vec<u32>| -> (Vec<u32>, usize) {
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
    let prompt = vec![7, 1, 8, 2, 8, 1, 8, 2, 8];
    let (first, cached) = run(prompt.clone());
    assert_eq!(cached, 0);
    let (second, cached) = run(prompt);
    assert_eq!(
        (second, cached),
        (first.clone(), 0),
        "nothing cut back, nothing reused"
    );
    assert_eq!(first.len(), 8);
    engine.shutdown().expect("shutdown");
}
