//! The `gemma4-assistant` provider on tiny random Gemma-4 targets: lossless
//! greedy output past the sliding window in both position modes and with
//! both heads, and typed errors for targets it cannot serve and broken
//! checkpoints. (Fault injection: `gemma4_assistant_faults.rs`.)

use std::ops::ControlFlow;
use std::path::Path;

use draft_gemma4_assistant as _;
use mlx_rs::Array;
use mlx_spec_scenarios::{write_tiny_assistant, write_tiny_gemma4, write_tiny_llama, AssistantHead, Gemma4Variant};
use serve_loop::{AdaptiveConfig, Output, Request, ServeError, SpecConfig, Speculation};
use spec_core::{DraftProvider, GreedySampler, ProviderOptions, Target};
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
    o.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    o
}

fn run(target: &dyn Target, prompt: &[u32], provider: Option<&dyn DraftProvider>, on_token: impl FnMut(u32) -> ControlFlow<()>) -> Result<Output, ServeError> {
    let mut sampler = GreedySampler;
    let speculation = provider.map(|provider| Speculation { provider, config: SpecConfig { num_draft: 3, adaptive: AdaptiveConfig::off(), ..SpecConfig::default() } });
    let request = Request { prompt, max_tokens: 20, is_eos: &|_| false, sampler: &mut sampler, processors: &mut [], speculation, cancel: None };
    serve_loop::generate(target, request, on_token)
}

fn tokens(target: &dyn Target, prompt: &[u32], provider: Option<&dyn DraftProvider>) -> Vec<u32> {
    run(target, prompt, provider, |_| ControlFlow::Continue(())).expect("generate").tokens
}

/// Prompts shorter than, about as long as and much longer than the window.
fn prompts() -> Vec<Vec<u32>> {
    vec![vec![5, 9, 2], (0..11).map(|i| (i * 7 + 1) % 96).collect(), (0..27).map(|i| (i * 13 + 4) % 96).collect()]
}

#[test]
fn speculative_greedy_equals_plain_past_the_window() {
    let heads = [AssistantHead::Tied, AssistantHead::Centroid];
    let assistants: Vec<_> = heads.iter().map(|&h| assistant_dir(h, BACKBONE, VOCAB)).collect();
    for variant in [Gemma4Variant::Text, Gemma4Variant::Shared] {
        let (_d, model) = target(variant);
        for (head, dir) in heads.iter().zip(&assistants) {
            for positions in ["advancing", "constant"] {
                let provider = serve_loop::build_provider(ID, &model, &options(dir.path(), &[("positions", positions)])).expect("build");
                let mut rolled_back = 0;
                for prompt in prompts() {
                    let plain = tokens(&model, &prompt, None);
                    let spec = run(&model, &prompt, Some(provider.as_ref()), |_| ControlFlow::Continue(())).expect("speculative");
                    assert_eq!(spec.tokens, plain, "{variant:?} {head:?} {positions} prompt of {}", prompt.len());
                    assert!(!spec.stats.untrimmable_fallback, "rollback past the window keeps speculating");
                    assert_eq!(spec.stats.drafted, 3 * spec.stats.acceptance_lengths.len(), "full-length rounds");
                    rolled_back += spec.stats.rejected;
                }
                assert!(rolled_back > 0, "{variant:?} {head:?}: rounds were rolled back");
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
    let err = serve_loop::build_provider(ID, &llama, &options(dir.path(), &[])).err().expect("llama is no Gemma-4").to_string();
    assert!(err.contains("not a Gemma-4") && err.contains(ID), "{err}");

    let (_d, gemma) = target(Gemma4Variant::Text);
    let wide = assistant_dir(AssistantHead::Tied, 32, VOCAB);
    let err = serve_loop::build_provider(ID, &gemma, &options(wide.path(), &[])).err().expect("backbone mismatch").to_string();
    assert!(err.contains("hidden size 64") && err.contains("backbone_hidden_size 32"), "{err}");
    let other_vocab = assistant_dir(AssistantHead::Tied, BACKBONE, 128);
    let err = serve_loop::build_provider(ID, &gemma, &options(other_vocab.path(), &[])).err().expect("vocab mismatch").to_string();
    assert!(err.contains("vocabulary"), "{err}");

    let err = serve_loop::build_provider(ID, &gemma, &ProviderOptions::new()).err().expect("no model").to_string();
    assert!(err.contains("`model`"), "{err}");
    let err = serve_loop::build_provider(ID, &gemma, &options(dir.path(), &[("positions", "sideways")])).err().expect("bad mode").to_string();
    assert!(err.contains("advancing or constant"), "{err}");
    let err = serve_loop::build_provider(ID, &gemma, &options(dir.path(), &[("gamma", "2")])).err().expect("unknown option").to_string();
    assert!(err.contains("`gamma`"), "{err}");
}

/// Rewrites the assistant in `dir` with `edit` applied to its tensors and
/// `config` to its config.
fn corrupt(dir: &Path, edit: impl FnOnce(&mut std::collections::HashMap<String, Array>), config: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("model.safetensors");
    let mut tensors = Array::load_safetensors(&path).expect("load tensors");
    // Read everything before the file is rewritten.
    mlx_rs::transforms::eval(tensors.values()).expect("eval");
    edit(&mut tensors);
    Array::save_safetensors(&tensors, None, &path).expect("save tensors");
    let cpath = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cpath).expect("config")).expect("json");
    config(&mut c);
    std::fs::write(&cpath, c.to_string()).expect("write config");
}

#[test]
fn broken_checkpoints_are_typed_errors() {
    let (_d, gemma) = target(Gemma4Variant::Text);
    type TensorEdit = Box<dyn FnOnce(&mut std::collections::HashMap<String, Array>)>;
    type ConfigEdit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(&str, TensorEdit, ConfigEdit)> = vec![
        ("missing tensor `model.layers.2.self_attn.q_norm.weight`", Box::new(|t| drop(t.remove("model.layers.2.self_attn.q_norm.weight"))), Box::new(|_| {})),
        (
            "token_ordering is not a permutation",
            Box::new(|t| {
                let ordering: Vec<i64> = (0..i64::from(VOCAB)).map(|i| i / 2).collect();
                t.insert("masked_embedding.token_ordering".into(), Array::from_slice(&ordering, &[VOCAB]));
            }),
            Box::new(|_| {}),
        ),
        ("shape [32, 64]", Box::new(|t| drop(t.insert("pre_projection.weight".into(), Array::zeros::<f32>(&[32, 64]).expect("zeros")))), Box::new(|_| {})),
        ("unexpected tensors", Box::new(|t| drop(t.insert("model.layers.0.self_attn.k_proj.weight".into(), Array::zeros::<f32>(&[32, 32]).expect("zeros")))), Box::new(|_| {})),
        ("not a Gemma-4 assistant", Box::new(|_| {}), Box::new(|c| c["model_type"] = "gemma4_text".into())),
        ("num_hidden_layers 5 does not match 4 layer_types", Box::new(|_| {}), Box::new(|c| c["text_config"]["num_hidden_layers"] = 5.into())),
        ("not a multiple of num_centroids", Box::new(|_| {}), Box::new(|c| c["num_centroids"] = 7.into())),
        ("missing `backbone_hidden_size`", Box::new(|_| {}), Box::new(|c| drop(c.as_object_mut().map(|o| o.remove("backbone_hidden_size"))))),
    ];
    for (expected, edit, config) in cases {
        let dir = assistant_dir(AssistantHead::Centroid, BACKBONE, VOCAB);
        corrupt(dir.path(), edit, config);
        let err = serve_loop::build_provider(ID, &gemma, &options(dir.path(), &[])).err().expect("must fail").to_string();
        assert!(err.contains(expected), "expected `{expected}` in: {err}");
    }
}
