//! Failures injected into a `gemma4-assistant` round — at the draft step
//! (the drafter's target-embedding lookups), the verify forward (after it
//! appended) and the trim — each leave the target caches at the last
//! committed offset, MLX's active memory at its level before, and the next
//! request on the same model correct. Alone in its test binary: active
//! memory is process-wide, so no other test may run beside it.

use std::cell::{Cell, RefCell};
use std::ops::ControlFlow;
use std::path::Path;
use std::rc::Rc;

use draft_gemma4_assistant as _;
use mlx_rs::Array;
use mlx_spec_scenarios::{
    greedy_run as run, greedy_tokens as tokens, write_tiny_assistant, write_tiny_gemma4,
    AssistantHead, Gemma4Variant,
};
use spec_core::{
    CacheSet, LayerCache, ProviderOptions, SpecError, Target, TargetInfo, TargetOutput,
};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, LoadOptions};

const WINDOW: usize = 8;
const ID: &str = "gemma4-assistant";

fn options(dir: &Path) -> ProviderOptions {
    ProviderOptions::from([("model".to_owned(), dir.display().to_string())])
}

/// Where a fault is injected (the count is 1-based over the request).
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The n-th target embedding lookup, which only the drafter's steps make.
    Draft(usize),
    /// The n-th verify forward (`Target::decode`), after it appended to the
    /// caches.
    Verify(usize),
    /// The n-th trim of cache 0.
    Trim(usize),
}

/// A cache that fails its n-th trim on cue and reports its offset when the
/// request drops it, if it ever held tokens (the serve loop also makes
/// fresh caches only to ask whether they can roll back).
#[derive(Debug)]
struct FaultyCache {
    inner: Box<dyn LayerCache>,
    fail_trim: Option<(Rc<Cell<usize>>, usize)>,
    dropped: Rc<RefCell<Vec<usize>>>,
    used: bool,
}

impl LayerCache for FaultyCache {
    fn offset(&self) -> usize {
        self.inner.offset()
    }
    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        self.used = true;
        self.inner.update_and_fetch(keys, values)
    }
    fn can_trim(&self, n: usize) -> bool {
        self.inner.can_trim(n)
    }
    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        self.inner.can_trim_after(append, n)
    }
    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if let Some((count, at)) = &self.fail_trim {
            count.set(count.get() + 1);
            if count.get() == *at {
                return Err(SpecError::Model("injected trim failure".into()));
            }
        }
        self.inner.trim(n)
    }
    fn window(&self) -> Option<usize> {
        self.inner.window()
    }
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
    fn contents(&self) -> Option<(Array, Array)> {
        self.inner.contents()
    }
}

impl Drop for FaultyCache {
    fn drop(&mut self) {
        if self.used {
            self.dropped.borrow_mut().push(self.inner.offset());
        }
    }
}

/// The target with faults on cue; `as_any` is the real Gemma-4 model's, so
/// the provider opens on it.
#[derive(Debug)]
struct FaultyTarget<'a> {
    inner: &'a Model,
    fault: Fault,
    embeds: Cell<usize>,
    verifies: Cell<usize>,
    trims: Rc<Cell<usize>>,
    dropped: Rc<RefCell<Vec<usize>>>,
}

impl<'a> FaultyTarget<'a> {
    fn new(inner: &'a Model, fault: Fault) -> Self {
        Self {
            inner,
            fault,
            embeds: Cell::new(0),
            verifies: Cell::new(0),
            trims: Rc::new(Cell::new(0)),
            dropped: Rc::new(RefCell::new(Vec::new())),
        }
    }
}

impl Target for FaultyTarget<'_> {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn make_caches(&self) -> CacheSet {
        let layers = self.inner.make_caches().into_layers();
        CacheSet::new(
            layers
                .into_iter()
                .enumerate()
                .map(|(i, inner)| {
                    let fail_trim = match self.fault {
                        Fault::Trim(at) if i == 0 => Some((self.trims.clone(), at)),
                        _ => None,
                    };
                    Box::new(FaultyCache {
                        inner,
                        fail_trim,
                        dropped: self.dropped.clone(),
                        used: false,
                    }) as Box<dyn LayerCache>
                })
                .collect(),
        )
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.inner.forward(tokens, caches, taps)
    }
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.verifies.set(self.verifies.get() + 1);
        let out = self.inner.decode(tokens, caches, taps)?;
        if matches!(self.fault, Fault::Verify(at) if at == self.verifies.get()) {
            out.hidden.eval()?;
            return Err(SpecError::Model("injected forward failure".into()));
        }
        Ok(out)
    }
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.inner.logits(hidden)
    }
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        self.embeds.set(self.embeds.get() + 1);
        if matches!(self.fault, Fault::Draft(at) if at == self.embeds.get()) {
            return Err(SpecError::Model("injected draft failure".into()));
        }
        self.inner.embed(tokens)
    }
    fn weights_bytes(&self) -> usize {
        self.inner.weights_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
}

#[test]
fn faults_in_an_assistant_round_leave_caches_committed_memory_released_and_the_model_serving() {
    let target_dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gemma4(target_dir.path(), 5, Gemma4Variant::Shared, WINDOW).expect("write target");
    let model = load_model(target_dir.path(), &LoadOptions::default()).expect("load target");
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_assistant(dir.path(), 3, AssistantHead::Centroid, 64, 96, WINDOW)
        .expect("write assistant");
    let provider = serve_loop::build_provider(ID, &model, &options(dir.path())).expect("build");
    let prompt: Vec<u32> = (0..13).map(|i| (i * 11 + 2) % 96).collect();
    let plain = tokens(&model, &prompt, None);
    // Warm up, then take the baseline: what a finished request leaves.
    assert_eq!(tokens(&model, &prompt, Some(provider.as_ref())), plain);
    let baseline = mlx_rs::memory::active_memory().expect("active memory");
    for fault in [
        Fault::Draft(1),
        Fault::Draft(5),
        Fault::Verify(1),
        Fault::Verify(3),
        Fault::Trim(1),
        Fault::Trim(3),
    ] {
        let faulty = FaultyTarget::new(&model, fault);
        let faulty_provider = serve_loop::build_provider(ID, &faulty, &options(dir.path()))
            .expect("build on the faulty target");
        let mut streamed = 0;
        let err = run(&faulty, &prompt, Some(faulty_provider.as_ref()), |_| {
            streamed += 1;
            ControlFlow::Continue(())
        })
        .expect_err("the fault must surface");
        assert!(err.to_string().contains("injected"), "{fault:?}: {err}");
        // Full prefill holds the prompt; every emitted token but the pending
        // one is in the caches at a round's start.
        let committed = prompt.len() + streamed - 1;
        let dropped = faulty.dropped.borrow().clone();
        assert!(
            !dropped.is_empty() && dropped.iter().all(|&o| o == committed),
            "{fault:?}: caches at {dropped:?}, last commit {committed}"
        );
        drop(faulty_provider);
        let after = mlx_rs::memory::active_memory().expect("active memory");
        assert!(
            after <= baseline,
            "{fault:?}: memory {after} above the baseline {baseline}"
        );
        // The next requests on the same model, plain and speculative, are right.
        assert_eq!(tokens(&model, &prompt, None), plain, "{fault:?}");
        assert_eq!(
            tokens(&model, &prompt, Some(provider.as_ref())),
            plain,
            "{fault:?}"
        );
    }
}
