//! Split invariance, the property `Target::split_invariant` claims: a token
//! sequence run through fresh caches in pieces (prompt chunks split at
//! arbitrary points, decoding windows, verify windows whose wrong drafts
//! are trimmed away) gives every row's hidden state and logits, the caches'
//! keys and values, and the next decoding steps, bit for bit as one
//! prefill of the whole sequence does. Checked on tiny llama (full and
//! sliding, unbounded and `--max-kv-size`), Gemma-4 (text with a window the sequence rotates, KV-shared,
//! MoE) and, ignored unless `MLX_SPEC_PREFIX_CACHE_MODEL` names it, the real model;
//! GLM does not claim it, and a split changes its bits.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::{CacheSet, Target};
use spec_models::{load_model, LoadOptions, LoadedModel};

/// One piece of a run.
#[derive(Debug, Clone, Copy)]
enum Piece {
    /// A prompt chunk of this many tokens (`Target::forward`).
    Prefill(usize),
    /// Decoding rows (`Target::decode`): a pending token and its drafts.
    Decode(usize),
    /// A verify window of `accepted` right tokens and `wrong` drafts, the
    /// wrong ones trimmed after the forward.
    Verify { accepted: usize, wrong: usize },
}

struct Run {
    /// Hidden states of every position `[1, N, H]`.
    hidden: Array,
    caches: CacheSet,
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

fn run(target: &dyn Target, tokens: &[u32], pieces: &[Piece]) -> Run {
    let vocab = target.info().vocab_size as u32;
    let mut caches = target.make_caches();
    let mut rows = Vec::new();
    let mut at = 0;
    for piece in pieces {
        let left = tokens.len() - at;
        match *piece {
            Piece::Prefill(n) | Piece::Decode(n) => {
                let n = n.min(left);
                let window = ids(&tokens[at..at + n]);
                let out = match piece {
                    Piece::Prefill(_) => target.forward(&window, &mut caches, &[]),
                    _ => target.decode(&window, &mut caches, &[]),
                }
                .expect("forward");
                rows.push(out.hidden);
                at += n;
            }
            Piece::Verify { accepted, wrong } => {
                let a = accepted.min(left).max(1);
                // As the serve loop does: only drafts the caches can roll back.
                let wrong = (0..=wrong)
                    .rev()
                    .find(|&w| caches.can_trim_after(a + w, w))
                    .unwrap_or(0);
                let mut window = tokens[at..at + a].to_vec();
                window.extend((0..wrong as u32).map(|k| (tokens[at + a - 1] + 1 + k) % vocab));
                let out = target
                    .decode(&ids(&window), &mut caches, &[])
                    .expect("decode");
                rows.push(out.hidden.index((.., ..a as i32, ..)));
                if wrong > 0 {
                    caches.trim(wrong).expect("trim the wrong drafts");
                }
                at += a;
            }
        }
        if at == tokens.len() {
            break;
        }
    }
    assert_eq!(at, tokens.len(), "the pieces cover the tokens");
    let hidden = concatenate(&rows, 1).expect("concatenate");
    hidden.eval().expect("eval");
    Run { hidden, caches }
}

fn bits(a: &Array) -> Vec<u32> {
    let a = a
        .as_dtype(mlx_rs::Dtype::Float32)
        .and_then(|a| a.contiguous())
        .expect("f32");
    a.eval().expect("eval");
    a.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
}

/// Whether each cache holds the same keys and values in both sets (the
/// rows both hold, oldest first: a sliding cache may keep more than its
/// window after a long chunk); the first cache that differs.
fn cache_difference(a: &CacheSet, b: &CacheSet) -> Option<usize> {
    let tail = |x: &Array, rows: i32| x.index((.., .., -rows.., ..));
    (0..a.len()).find(|&i| {
        let (ca, cb) = (
            a.get(i).and_then(|c| c.contents()),
            b.get(i).and_then(|c| c.contents()),
        );
        match (ca, cb) {
            (None, None) => false,
            (Some((ka, va)), Some((kb, vb))) if ka.shape() == kb.shape() => {
                bits(&ka) != bits(&kb) || bits(&va) != bits(&vb)
            }
            (Some((ka, va)), Some((kb, vb))) if ka.ndim() == 4 && kb.ndim() == 4 => {
                let rows = ka.shape()[2].min(kb.shape()[2]);
                bits(&tail(&ka, rows)) != bits(&tail(&kb, rows))
                    || bits(&tail(&va, rows)) != bits(&tail(&vb, rows))
            }
            _ => true,
        }
    })
}

/// Whether every piece schedule gives the bits of one prefill: hidden
/// states and logits of every row, the caches, and three decoding steps
/// after; returns the first difference found.
fn first_difference(target: &dyn Target, tokens: &[u32]) -> Option<String> {
    let cold = run(target, tokens, &[Piece::Prefill(tokens.len())]);
    let cold_logits = bits(&target.logits(&cold.hidden).expect("logits"));
    let then = [3u32, 17, 5];
    for (name, pieces) in schedules(tokens.len()) {
        let split = run(target, tokens, &pieces);
        if bits(&split.hidden) != bits(&cold.hidden) {
            return Some(format!("{name}: hidden states"));
        }
        if bits(&target.logits(&split.hidden).expect("logits")) != cold_logits {
            return Some(format!("{name}: logits"));
        }
        if let Some(i) = cache_difference(&split.caches, &cold.caches) {
            return Some(format!("{name}: cache {i}"));
        }
        let (mut a, mut b) = (split.caches, cold.caches.duplicate().expect("duplicate"));
        for t in then {
            let ha = target.decode(&ids(&[t]), &mut a, &[]).expect("decode");
            let hb = target.decode(&ids(&[t]), &mut b, &[]).expect("decode");
            if bits(&ha.hidden) != bits(&hb.hidden) {
                return Some(format!("{name}: decoding after"));
            }
        }
    }
    None
}

/// Piece schedules over `n` tokens: chunks cut at arbitrary points, token
/// by token, verify windows with rejections, and mixes of them.
fn schedules(n: usize) -> Vec<(String, Vec<Piece>)> {
    let mut out = vec![
        (
            "7 + rest".to_string(),
            vec![Piece::Prefill(7), Piece::Prefill(n)],
        ),
        ("one by one".to_string(), vec![Piece::Decode(1); n]),
        (
            "prefill, then verify windows".to_string(),
            std::iter::once(Piece::Prefill(n / 3))
                .chain(std::iter::repeat_n(
                    Piece::Verify {
                        accepted: 2,
                        wrong: 2,
                    },
                    n,
                ))
                .collect(),
        ),
    ];
    // Pseudo-random mixes (fixed seeds).
    for seed in 1..=4u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut pieces = Vec::new();
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 9) as usize + 1;
            pieces.push(match (x >> 8) % 3 {
                0 => Piece::Prefill(len),
                1 => Piece::Decode(len.min(4)),
                _ => Piece::Verify {
                    accepted: len.min(5),
                    wrong: (x >> 16) as usize % 4,
                },
            });
        }
        out.push((format!("mix {seed}"), pieces));
    }
    out
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + i / 5) % (vocab - 2) + 1) as u32)
        .collect()
}

fn load(dir: &std::path::Path) -> LoadedModel {
    load_model(dir, &LoadOptions::default()).expect("load")
}

fn check(model: &dyn Target, name: &str, n: usize) {
    assert!(model.split_invariant(), "{name} claims split invariance");
    let seq = tokens(n, model.info().vocab_size.min(1000));
    if let Some(diff) = first_difference(model, &seq) {
        panic!("{name} is not split-invariant: {diff}");
    }
}

#[test]
fn llama_is_split_invariant() {
    for window in [None, Some(6)] {
        let dir = tempfile::tempdir().expect("tempdir");
        mlx_spec_scenarios::write_tiny_llama_with(dir.path(), 7, window).expect("write");
        check(&load(dir.path()), &format!("llama, window {window:?}"), 40);
    }
}

/// `--max-kv-size 10`: every query sees the first 4 positions and the last
/// 6, over 40 tokens (prompt chunks past the bound, verify windows and
/// rollbacks after the window moved); with a sliding layer, that layer
/// keeps its own window.
#[test]
fn llama_with_bounded_caches_is_split_invariant() {
    for window in [None, Some(6)] {
        let dir = tempfile::tempdir().expect("tempdir");
        mlx_spec_scenarios::write_tiny_llama_with(dir.path(), 7, window).expect("write");
        let options = LoadOptions {
            max_kv_size: Some(10),
            ..LoadOptions::default()
        };
        let model = load_model(dir.path(), &options).expect("load");
        check(
            &model,
            &format!("llama, max-kv-size 10, window {window:?}"),
            40,
        );
    }
}

#[test]
fn gemma4_is_split_invariant() {
    use mlx_spec_scenarios::{write_tiny_gemma4, Gemma4Variant};
    for variant in [
        Gemma4Variant::Text,
        Gemma4Variant::Shared,
        Gemma4Variant::Moe,
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_tiny_gemma4(dir.path(), 5, variant, 4).expect("write");
        check(&load(dir.path()), &format!("gemma4 {variant:?}"), 40);
    }
}

/// The mutation check of the capability: GLM does not claim it, and a
/// split of its prefill does change bits, so a prefix cache that took its
/// caches at any boundary would not be exact.
#[test]
fn glm_is_not_split_invariant_and_does_not_claim_it() {
    for spec in [
        spec_fixtures::glm::Glm::default(),
        spec_fixtures::glm::Glm::glm52_tiny(),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        spec.write(dir.path()).expect("write");
        let model = load(dir.path());
        assert!(!model.split_invariant());
        let seq = tokens(40, model.info().vocab_size);
        assert!(
            first_difference(&model, &seq).is_some(),
            "a split of GLM's prefill gave the same bits"
        );
    }
}

/// The real model (SmolLM2-135M-Instruct, float32), run by gate
/// `prefix-cache` with `MLX_SPEC_PREFIX_CACHE_MODEL` naming its directory.
#[test]
#[ignore = "needs the real model: gate prefix-cache runs it"]
fn real_model_is_split_invariant() {
    let dir = std::env::var_os("MLX_SPEC_PREFIX_CACHE_MODEL")
        .expect("MLX_SPEC_PREFIX_CACHE_MODEL names the real model's directory");
    check(&load(std::path::Path::new(&dir)), "SmolLM2-135M", 48);
}
