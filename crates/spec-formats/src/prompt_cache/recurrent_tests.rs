//! Hybrid models' prompt-cache files: a Gated DeltaNet layer's states as an
//! `ArraysCache` beside the attention layers' `KVCache`s, round trips bit
//! for bit (dense and expert layers), and files that do not fit refused
//! naming the entry.

use std::collections::BTreeMap;

use spec_fixtures::qwen3_next::{Qwen3Next, GATE, GATE_QWEN3_5_MOE};

use super::layout;
use super::recurrent::ARRAYS_CACHE;
use super::tests::{continue_logits, fixture, load_err, prefill, prompt, round_trip, write_raw};
use super::tree::Node;
use super::{load_prompt_cache, save_prompt_cache, PromptCacheError};

fn hybrid(spec: Qwen3Next) -> super::tests::Fixture {
    fixture(|d| {
        Qwen3Next {
            interval: 2,
            ..spec
        }
        .write(d)
        .expect("write")
    })
}

#[test]
fn dense_hybrid_caches_round_trip_bit_for_bit() {
    let f = hybrid(GATE.tiny(3));
    round_trip(&f, &prompt(21));
}

#[test]
fn expert_hybrid_caches_continue_as_the_caches_saved() {
    // Its prefill chunks sort their expert picks: the loaded caches are
    // compared with the very split they were saved from.
    let f = hybrid(GATE_QWEN3_5_MOE.tiny(4));
    let model = f.model.as_ref();
    let tokens = prompt(21);
    let mut saved = prefill(model, &tokens, 5);
    let file = f.dir.path().join("cache.safetensors");
    save_prompt_cache(&file, &saved, &tokens, &f.identity, &BTreeMap::new()).expect("save");
    let mut loaded = load_prompt_cache(&file, model, &f.identity)
        .expect("load")
        .caches;
    assert_eq!(loaded.offset(), tokens.len());
    let suffix = [11u32, 12, 13];
    assert_eq!(
        continue_logits(model, &mut loaded, &suffix),
        continue_logits(model, &mut saved, &suffix)
    );
}

#[test]
fn recurrent_states_that_do_not_fit_are_refused_naming_the_entry() {
    let f = hybrid(GATE.tiny(3));
    let other = hybrid(Qwen3Next {
        linear_value_heads: 2,
        ..GATE.tiny(3)
    });
    let entries =
        layout::entries_of(&prefill(other.model.as_ref(), &prompt(9), 4)).expect("entries");
    assert_eq!(entries[0].class, ARRAYS_CACHE);
    let file = f.dir.path().join("other.safetensors");
    write_raw(&file, &entries);
    let err = load_err(&f, &file);
    assert!(matches!(err, PromptCacheError::Mismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("entry 0: state 0 of shape"),
        "{err}"
    );

    let mut entries =
        layout::entries_of(&prefill(f.model.as_ref(), &prompt(9), 4)).expect("entries");
    if let Node::List(items) = &mut entries[0].state {
        items[1] = Node::Int(3);
    }
    let file = f.dir.path().join("padded.safetensors");
    write_raw(&file, &entries);
    let err = load_err(&f, &file);
    assert!(err.to_string().contains("padded batch"), "{err}");

    let mut entries =
        layout::entries_of(&prefill(f.model.as_ref(), &prompt(9), 4)).expect("entries");
    entries.swap(0, 1);
    let file = f.dir.path().join("swapped.safetensors");
    write_raw(&file, &entries);
    let err = load_err(&f, &file);
    assert!(err.to_string().contains("entry 0 is a KVCache"), "{err}");
}
