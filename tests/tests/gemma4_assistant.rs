//! The `gemma4-assistant` provider on tiny random Gemma-4 targets: lossless
//! greedy output past the sliding window in every position mode and with
//! both heads, and typed errors for targets it cannot serve and broken
//! checkpoints; the source chains the committed hidden and refuses misuse
//! (draft before prefill, draft before commit, a commit of the wrong count).
//! (Fault injection: `gemma4_assistant_faults.rs`.)

use std::ops::ControlFlow;
use std::path::Path;

use draft_gemma4_assistant as _;
use mlx_rs::Array;
use mlx_spec_scenarios::{
    greedy_run as run, greedy_tokens as tokens, write_tiny_assistant, write_tiny_gemma4,
    write_tiny_llama, AssistantHead, Gemma4Variant,
};
use spec_core::{GreedySampler, ProviderOptions, SpecError, Target};
use spec_models::LoadedModel as Model;
use spec_models::{load_model, LoadOptions};

const WINDOW: usize = 8;
const VOCAB: i32 = 96;
const BACKBONE: i32 = 64;
const ID: &str = "gemma4-assistant";

fn target(variant: Gemma4Variant) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_gemma4(dir.path(), 5, variant, WINDOW).expect("write target");
    let model = load_model(dir.path(), &LoadOptions::default()).expect("load target");
    (dir, model)
}

fn assistant_dir(head: AssistantHead, backbone: i32, vocab: i32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_assistant(dir.path(), 3, head, backbone, vocab, WINDOW).expect("write assistant");
    dir
}

fn options(dir: &Path, extra: &[(&str, &str)]) -> ProviderOptions {
    let mut o = ProviderOptions::from([("model".to_owned(), dir.display().to_string())]);
    o.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    o
}

/// Prompts shorter than, about as long as and much longer than the window.
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 9, 2],
        (0..11).map(|i| (i * 7 + 1) % 96).collect(),
        (0..27).map(|i| (i * 13 + 4) % 96).collect(),
    ]
}

#[test]
fn speculative_greedy_equals_plain_past_the_window() {
    let heads = [AssistantHead::Tied, AssistantHead::Centroid];
    let assistants: Vec<_> = heads
        .iter()
        .map(|&h| assistant_dir(h, BACKBONE, VOCAB))
        .collect();
    for variant in [Gemma4Variant::Text, Gemma4Variant::Shared] {
        let (_d, model) = target(variant);
        for (head, dir) in heads.iter().zip(&assistants) {
            for positions in ["constant", "advancing", "advancing-from-last-cached"] {
                let provider = serve_loop::build_provider(
                    ID,
                    &model,
                    &options(dir.path(), &[("positions", positions)]),
                )
                .expect("build");
                let mut rolled_back = 0;
                for prompt in prompts() {
                    let plain = tokens(&model, &prompt, None);
                    let spec = run(&model, &prompt, Some(provider.as_ref()), |_| {
                        ControlFlow::Continue(())
                    })
                    .expect("speculative");
                    assert_eq!(
                        spec.tokens,
                        plain,
                        "{variant:?} {head:?} {positions} prompt of {}",
                        prompt.len()
                    );
                    assert!(
                        !spec.stats.untrimmable_fallback,
                        "rollback past the window keeps speculating"
                    );
                    assert_eq!(
                        spec.stats.drafted,
                        3 * spec.stats.acceptance_lengths.len(),
                        "full-length rounds"
                    );
                    rolled_back += spec.stats.rejected;
                }
                assert!(
                    rolled_back > 0,
                    "{variant:?} {head:?}: rounds were rolled back"
                );
            }
        }
    }
}

#[test]
fn open_refuses_targets_it_cannot_serve() {
    let dir = assistant_dir(AssistantHead::Centroid, BACKBONE, VOCAB);
    let llama_dir = tempfile::tempdir().expect("tempdir");
    write_tiny_llama(llama_dir.path(), 7).expect("llama");
    let llama = load_model(llama_dir.path(), &LoadOptions::default()).expect("load llama");
    let err = serve_loop::build_provider(ID, &llama, &options(dir.path(), &[]))
        .err()
        .expect("llama is no Gemma-4")
        .to_string();
    assert!(err.contains("not a Gemma-4") && err.contains(ID), "{err}");

    let (_d, gemma) = target(Gemma4Variant::Text);
    let wide = assistant_dir(AssistantHead::Tied, 32, VOCAB);
    let err = serve_loop::build_provider(ID, &gemma, &options(wide.path(), &[]))
        .err()
        .expect("backbone mismatch")
        .to_string();
    assert!(
        err.contains("hidden size 64") && err.contains("backbone_hidden_size 32"),
        "{err}"
    );
    let other_vocab = assistant_dir(AssistantHead::Tied, BACKBONE, 128);
    let err = serve_loop::build_provider(ID, &gemma, &options(other_vocab.path(), &[]))
        .err()
        .expect("vocab mismatch")
        .to_string();
    assert!(err.contains("vocabulary"), "{err}");

    let err = serve_loop::build_provider(ID, &gemma, &ProviderOptions::new())
        .err()
        .expect("no model")
        .to_string();
    assert!(err.contains("`model`"), "{err}");
    let err = serve_loop::build_provider(
        ID,
        &gemma,
        &options(dir.path(), &[("positions", "sideways")]),
    )
    .err()
    .expect("bad mode")
    .to_string();
    assert!(
        err.contains("constant, advancing or advancing-from-last-cached"),
        "{err}"
    );
    let err = serve_loop::build_provider(ID, &gemma, &options(dir.path(), &[("gamma", "2")]))
        .err()
        .expect("unknown option")
        .to_string();
    assert!(err.contains("`gamma`"), "{err}");
}

/// Rewrites the assistant in `dir` with `edit` applied to its tensors and
/// `config` to its config.
fn corrupt(
    dir: &Path,
    edit: impl FnOnce(&mut std::collections::HashMap<String, Array>),
    config: impl FnOnce(&mut serde_json::Value),
) {
    let path = dir.join("model.safetensors");
    let mut tensors = Array::load_safetensors(&path).expect("load tensors");
    // Read everything before the file is rewritten.
    mlx_rs::transforms::eval(tensors.values()).expect("eval");
    edit(&mut tensors);
    Array::save_safetensors(&tensors, None, &path).expect("save tensors");
    let cpath = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cpath).expect("config")).expect("json");
    config(&mut c);
    std::fs::write(&cpath, c.to_string()).expect("write config");
}

#[test]
fn broken_checkpoints_are_typed_errors() {
    let (_d, gemma) = target(Gemma4Variant::Text);
    type TensorEdit = Box<dyn FnOnce(&mut std::collections::HashMap<String, Array>)>;
    type ConfigEdit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(&str, TensorEdit, ConfigEdit)> = vec![
        (
            "missing tensor `model.layers.2.self_attn.q_norm.weight`",
            Box::new(|t| drop(t.remove("model.layers.2.self_attn.q_norm.weight"))),
            Box::new(|_| {}),
        ),
        (
            "token_ordering is not a permutation",
            Box::new(|t| {
                let ordering: Vec<i64> = (0..i64::from(VOCAB)).map(|i| i / 2).collect();
                t.insert(
                    "masked_embedding.token_ordering".into(),
                    Array::from_slice(&ordering, &[VOCAB]),
                );
            }),
            Box::new(|_| {}),
        ),
        (
            "shape [32, 64]",
            Box::new(|t| {
                drop(t.insert(
                    "pre_projection.weight".into(),
                    Array::zeros::<f32>(&[32, 64]).expect("zeros"),
                ))
            }),
            Box::new(|_| {}),
        ),
        (
            "unexpected tensors",
            Box::new(|t| {
                drop(t.insert(
                    "model.layers.0.self_attn.k_proj.weight".into(),
                    Array::zeros::<f32>(&[32, 32]).expect("zeros"),
                ))
            }),
            Box::new(|_| {}),
        ),
        (
            "not a Gemma-4 assistant",
            Box::new(|_| {}),
            Box::new(|c| c["model_type"] = "gemma4_text".into()),
        ),
        (
            "num_hidden_layers 5 does not match 4 layer_types",
            Box::new(|_| {}),
            Box::new(|c| c["text_config"]["num_hidden_layers"] = 5.into()),
        ),
        (
            "not a multiple of num_centroids",
            Box::new(|_| {}),
            Box::new(|c| c["num_centroids"] = 7.into()),
        ),
        (
            "missing `backbone_hidden_size`",
            Box::new(|_| {}),
            Box::new(|c| drop(c.as_object_mut().map(|o| o.remove("backbone_hidden_size")))),
        ),
    ];
    for (expected, edit, config) in cases {
        let dir = assistant_dir(AssistantHead::Centroid, BACKBONE, VOCAB);
        corrupt(dir.path(), edit, config);
        let err = serve_loop::build_provider(ID, &gemma, &options(dir.path(), &[]))
            .err()
            .expect("must fail")
            .to_string();
        assert!(err.contains(expected), "expected `{expected}` in: {err}");
    }
}

#[test]
fn the_source_chains_the_committed_hidden_and_refuses_misuse() {
    use mlx_rs::ops::indexing::IndexOp;
    use spec_core::{CommitInfo, DraftRequest};

    let (_d, model) = target(Gemma4Variant::Text);
    let dir = assistant_dir(AssistantHead::Tied, BACKBONE, VOCAB);
    let provider =
        serve_loop::build_provider(ID, &model, &options(dir.path(), &[])).expect("build");
    let prompt: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % 96).collect();
    let mut caches = model.make_caches();
    let prefill = model
        .forward(
            &Array::from_slice(&prompt, &[1, prompt.len() as i32]),
            &mut caches,
            &[],
        )
        .expect("prefill");
    let anchor = prefill.hidden.index((.., -1.., ..));
    let mut sampler = GreedySampler;
    let mut source = provider.open(&model).expect("open");
    let before = source.draft(
        DraftRequest {
            feed: &[7],
            max_tokens: 3,
            anchor_hidden: Some(&anchor),
            history: &[7],
            target_caches: Some(&caches),
        },
        &mut sampler,
    );
    assert!(
        matches!(before, Err(SpecError::Protocol(_))),
        "draft before prefill: {before:?}"
    );
    source.prefill(&prompt, None).expect("prefill");
    let first = source
        .draft(
            DraftRequest {
                feed: &[7],
                max_tokens: 3,
                anchor_hidden: Some(&anchor),
                history: &[7],
                target_caches: Some(&caches),
            },
            &mut sampler,
        )
        .expect("draft");
    assert_eq!(first.tokens.len(), 3);
    let again = source.draft(
        DraftRequest {
            feed: &[7],
            max_tokens: 3,
            anchor_hidden: Some(&anchor),
            history: &[7],
            target_caches: Some(&caches),
        },
        &mut sampler,
    );
    assert!(
        matches!(again, Err(SpecError::Protocol(_))),
        "draft before commit: {again:?}"
    );

    // Verify the drafts, accept one, and let the source keep the hidden at
    // position 1 of the window.
    let mut window = vec![7u32];
    window.extend(&first.tokens);
    let verified = model
        .forward(&Array::from_slice(&window, &[1, 4]), &mut caches, &[])
        .expect("verify");
    caches.trim(2).expect("trim");
    let bad = source.commit(CommitInfo {
        drafted: 2,
        accepted: 1,
        accepted_tokens: &first.tokens[..1],
        foreign: &[],
        next: 9,
        verified_taps: None,
        verified_hidden: &verified.hidden,
    });
    assert!(
        matches!(bad, Err(SpecError::Protocol(_))),
        "commit of the wrong count: {bad:?}"
    );
    let mut source = provider.open(&model).expect("open");
    source.prefill(&prompt, None).expect("prefill");
    let mut fresh = model.make_caches();
    model
        .forward(
            &Array::from_slice(&prompt, &[1, prompt.len() as i32]),
            &mut fresh,
            &[],
        )
        .expect("prefill");
    let d = source
        .draft(
            DraftRequest {
                feed: &[7],
                max_tokens: 3,
                anchor_hidden: Some(&anchor),
                history: &[7],
                target_caches: Some(&fresh),
            },
            &mut sampler,
        )
        .expect("draft");
    assert_eq!(
        d.tokens, first.tokens,
        "same caches, same anchor, same drafts"
    );
    source
        .commit(CommitInfo {
            drafted: 3,
            accepted: 1,
            accepted_tokens: &d.tokens[..1],
            foreign: &[],
            next: 9,
            verified_taps: None,
            verified_hidden: &verified.hidden,
        })
        .expect("commit");
    // Without an anchor the source chains the committed hidden: the same
    // drafts as with the anchor the serve loop would pass, verified[1].
    let chained = source
        .draft(
            DraftRequest {
                feed: &[9],
                max_tokens: 3,
                anchor_hidden: None,
                history: &[9],
                target_caches: Some(&caches),
            },
            &mut sampler,
        )
        .expect("chained draft");
    let mut other = provider.open(&model).expect("open");
    other.prefill(&prompt, None).expect("prefill");
    let h1 = verified.hidden.index((.., 1..2, ..));
    let explicit = other
        .draft(
            DraftRequest {
                feed: &[9],
                max_tokens: 3,
                anchor_hidden: Some(&h1),
                history: &[9],
                target_caches: Some(&caches),
            },
            &mut sampler,
        )
        .expect("explicit draft");
    assert_eq!(chained.tokens, explicit.tokens);
    let h0 = verified.hidden.index((.., 0..1, ..));
    let mut third = provider.open(&model).expect("open");
    third.prefill(&prompt, None).expect("prefill");
    let wrong = third
        .draft(
            DraftRequest {
                feed: &[9],
                max_tokens: 3,
                anchor_hidden: Some(&h0),
                history: &[9],
                target_caches: Some(&caches),
            },
            &mut sampler,
        )
        .expect("other hidden");
    assert_ne!(
        wrong.tokens, explicit.tokens,
        "the hidden matters (else this test proves nothing)"
    );
}
