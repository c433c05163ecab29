//! The check every family with streamed experts runs: a model whose routed
//! experts stream through tiers from one layer's experts up gives the
//! resident model's logits bit for bit, greedy step by step (a 33-token
//! prompt whose picks take the sorted form, then single tokens) and in a
//! packed batch of rows of different lengths and forms; the tier evicts
//! and rereads below the whole set.

use std::path::Path;

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use spec_core::{BatchRow, RowForm, Target};

use crate::batch_check::{bits, ids, mixed, prepared, Case};
use crate::{expert_store, load_model, LoadOptions, LoadedModel, ModelError};

/// The model at `dir` with its routed experts streamed through a tier of
/// `bytes`.
pub(crate) fn streamed(dir: &Path, bytes: usize) -> Result<LoadedModel, ModelError> {
    let options = LoadOptions {
        expert_cache_bytes: Some(bytes),
        ..LoadOptions::default()
    };
    load_model(dir, &options)
}

/// One expert's bytes, from the error a zero-byte tier gives.
pub(crate) fn expert_bytes(dir: &Path) -> usize {
    match streamed(dir, 0) {
        Err(ModelError::ExpertTier { needed, .. }) => needed as usize,
        Err(other) => panic!("a zero-byte tier must be refused by size: {other}"),
        Ok(_) => panic!("a zero-byte tier must be refused"),
    }
}

/// Greedy decoding from a 33-token prompt, then one token at a time: each
/// step's logits' bits and the tokens.
fn greedy(model: &dyn Target, steps: usize) -> (Vec<Vec<u32>>, Vec<u32>) {
    let prompt: Vec<u32> = (0..33).map(|i| (i * 7 + 3) % 90).collect();
    let mut caches = model.make_caches();
    let mut x = ids(&prompt);
    let (mut logits, mut tokens) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let out = model.forward(&x, &mut caches, &[]).expect("forward");
        let last = model
            .logits(&out.hidden.index((.., -1, ..)))
            .expect("logits");
        let next = argmax_axis(&last, -1, None)
            .expect("argmax")
            .item_cast::<u32>();
        logits.push(bits(&last));
        tokens.push(next);
        x = ids(&[next]);
    }
    (logits, tokens)
}

/// The packed forward over `cases`: its logits' bits.
fn batch_bits(model: &dyn Target, cases: &[Case]) -> Vec<u32> {
    let mut caches: Vec<_> = cases.iter().map(|c| prepared(model, c)).collect();
    let mut rows: Vec<BatchRow<'_>> = cases
        .iter()
        .zip(caches.iter_mut())
        .map(|(c, caches)| BatchRow {
            tokens: &c.window,
            caches,
            form: c.form,
        })
        .collect();
    let out = model.forward_batch(&mut rows, &[]).expect("forward_batch");
    bits(&model.logits(&out.hidden).expect("logits"))
}

/// The model at `dir` (`moe_layers` expert layers of `experts` each),
/// streamed through tiers of one layer's experts, two and a bit, and all
/// of them, against the resident model.
pub(crate) fn check(dir: &Path, moe_layers: usize, experts: usize) {
    let resident = load_model(dir, &LoadOptions::default()).expect("resident");
    let want = greedy(resident.as_ref(), 6);
    let mut cases = mixed(14);
    let long: Vec<u32> = (0..33).map(|i| (i * 5 + 1) % 90).collect();
    cases.push(Case::new(1..4, &long, RowForm::Prefill));
    let want_batch = batch_bits(resident.as_ref(), &cases);
    let layer = experts * expert_bytes(dir);
    for bytes in [layer, 2 * layer + 1, moe_layers * layer] {
        let model = streamed(dir, bytes).expect("streamed");
        assert!(
            model.weights_bytes() < resident.weights_bytes(),
            "experts left on disk"
        );
        let got = greedy(model.as_ref(), 6);
        assert_eq!(got.1, want.1, "tier {bytes}: tokens");
        assert!(got.0 == want.0, "tier {bytes}: logits bit for bit");
        assert!(
            batch_bits(model.as_ref(), &cases) == want_batch,
            "tier {bytes}: batch"
        );
        let stats = expert_store(model.as_ref()).expect("streamed").stats();
        assert!(stats.misses > 0 && stats.resident_bytes as usize <= bytes);
        if bytes < moe_layers * layer {
            assert!(
                stats.bytes_read > stats.capacity_bytes,
                "the tier evicted and reread"
            );
        }
    }
    assert!(expert_store(resident.as_ref()).is_none());
}
