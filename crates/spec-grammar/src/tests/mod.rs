//! Tests on the real SmolLM2-135M vocabulary: the GGUF-built tokenizer
//! (fetched by spec-hub on first use, like spec-text's tests), the same
//! tokenizer written and read back as `tokenizer.json`, and the gate
//! model's `tokenizer.json` when `cargo xtask` has made it.

mod errors;
mod layout;
mod state;
mod two_sources;
mod walk;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rand::rngs::StdRng;
use rand::Rng;
use spec_core::{Constraint, TokenMask};
use spec_text::Tokenizer;

use crate::{GrammarConstraint, GrammarSpec, TokenEnv};

/// Ids past the tokenizer's vocabulary in the test model's logits (a
/// padded embedding): never allowed.
const PADDING: usize = 70;

/// A token environment is shared across threads; a constraint moves to one.
#[test]
fn shareable() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<TokenEnv>();
    send::<GrammarConstraint>();
}

fn gguf_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = spec_hub::default_model().expect("default model");
            Arc::new(Tokenizer::from_gguf(&path).expect("GGUF tokenizer"))
        })
        .clone()
}

/// The token environment of the GGUF-built tokenizer, logits padded.
fn env() -> &'static TokenEnv {
    static ENV: OnceLock<TokenEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        let tokenizer = gguf_tokenizer();
        let vocab = tokenizer.vocab_size() + PADDING;
        TokenEnv::new(tokenizer, vocab).expect("token env")
    })
}

/// The gate model's `tokenizer.json`, when `cargo xtask` has made it.
fn gate_tokenizer_json() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/gate-models/smollm2-135m-f32/tokenizer.json");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "note: {} is absent (made by `cargo xtask`); comparing with the GGUF \
             tokenizer written as tokenizer.json only",
            path.display()
        );
        None
    }
}

fn compile(spec: &GrammarSpec) -> GrammarConstraint {
    env().constraint(spec).expect("compiles")
}

fn encode(text: &str) -> Vec<u32> {
    gguf_tokenizer().encode(text, false).expect("encode")
}

fn decode(ids: &[u32]) -> String {
    gguf_tokenizer().decode(ids, false).expect("decode")
}

/// The mask of the current state.
fn mask_now(c: &mut GrammarConstraint) -> TokenMask {
    let mut masks = c.masks(&[]).expect("mask");
    assert_eq!(masks.len(), 1);
    masks.remove(0)
}

fn allowed_ids(mask: &TokenMask) -> Vec<u32> {
    (0..mask.len() as u32)
        .filter(|&id| mask.allows(id))
        .collect()
}

/// Asserts what every mask must hold: no EOS id, nothing past the
/// tokenizer's vocabulary, and something allowed unless only the end is.
fn check_mask(mask: &TokenMask) {
    let tokenizer = gguf_tokenizer();
    for &eos in tokenizer.eos_token_ids() {
        assert!(!mask.allows(eos), "EOS {eos} allowed as an ordinary token");
    }
    for id in tokenizer.vocab_size()..mask.len() {
        assert!(!mask.allows(id as u32), "padding id {id} allowed");
    }
    assert!(mask.count() > 0 || mask.end_allowed, "a dead end");
}

/// Generates with a seeded random choice among the allowed ids until the
/// constraint is complete (or, where it may end, with probability
/// `stop_chance`); returns the ids.
fn random_walk(
    c: &mut GrammarConstraint,
    rng: &mut StdRng,
    stop_chance: f64,
    max_steps: usize,
) -> Vec<u32> {
    let mut out = Vec::new();
    for _ in 0..max_steps {
        let mask = mask_now(c);
        check_mask(&mask);
        if c.is_complete() {
            assert!(
                mask.end_allowed && mask.count() == 0,
                "complete: only the end"
            );
            return out;
        }
        let ids = allowed_ids(&mask);
        if mask.end_allowed && (ids.is_empty() || rng.random_bool(stop_chance)) {
            return out;
        }
        let id = ids[rng.random_range(0..ids.len())];
        c.commit(&[id]).expect("an allowed token commits");
        out.push(id);
    }
    panic!("no end after {max_steps} steps: {:?}", decode(&out));
}
