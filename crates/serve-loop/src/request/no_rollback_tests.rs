//! A target whose caches cannot roll back (a hybrid model's recurrent
//! layers): every provider is refused before it opens, with an error naming
//! why; plain decoding runs, alone and through the engine with its prefix
//! cache on (which keeps nothing it could not cut back).

use std::cell::Cell;
use std::ops::ControlFlow;

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::Array;
use spec_core::{DraftProvider, DraftSource, SpecError, Target};
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

fn hybrid() -> (tempfile::TempDir, spec_models::LoadedModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(11).write(dir.path()).expect("fixture");
    let model = spec_models::load_model(dir.path(), &Default::default()).expect("load");
    (dir, model)
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
    let (_d, target) = hybrid();
    let provider = Counting {
        opened: Cell::new(0),
    };
    let prompt = vec![3, 14, 15, 92, 65];
    let mut spec = Request::new(prompt.clone(), 6);
    spec.speculation = Some(ProviderChoice::new("counting", SpecConfig::default()));
    let err = generate(target.as_ref(), &[&provider], spec, |_| {
        ControlFlow::Continue(())
    })
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
        target.as_ref(),
        &[&provider],
        Request::new(prompt.clone(), 12),
        |_| ControlFlow::Continue(()),
    )
    .expect("plain decoding");
    assert_eq!(plain.tokens, greedy(target.as_ref(), &prompt, 12));
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
