//! Requests that start from a prompt-cache file: the prefix's caches are
//! saved after a full prefill, read back, and handed to the serve loop as
//! `Request::prefix`; plain and speculative greedy output (prompt lookup,
//! draft-model, GLM's native MTP, the Gemma-4 assistant over a sliding
//! window the prefix has rotated) equal plain output without the cache.
//! A prefix covering the whole prompt and a provider reading tapped layers
//! are refused.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;

use draft_gemma4_assistant as _;
use draft_glm52_mtp as _;
use draft_model as _;
use draft_prompt_lookup as _;
use draft_qwen3_mtp as _;
use draft_suffix as _;
use mlx_rs::Array;
use mlx_spec_scenarios::{greedy_with, Tapping};
use serve_loop::ServeError;
use spec_core::{CacheSet, DraftProvider, ProviderOptions, Target};
use spec_fixtures::glm::Glm;
use spec_formats::prompt_cache::{load_prompt_cache, save_prompt_cache, ModelIdentity};
use spec_models::{load_model, DtypePolicy, LoadOptions, LoadedModel};

fn load(dir: &Path) -> (LoadedModel, ModelIdentity) {
    let model = load_model(dir, &LoadOptions::default()).expect("load");
    let identity =
        ModelIdentity::new("tiny".into(), dir, DtypePolicy::Float32, None).expect("fingerprint");
    (model, identity)
}

/// The caches of `prefix` after a full prefill, through a file.
fn cached(model: &dyn Target, identity: &ModelIdentity, prefix: &[u32], file: &Path) -> CacheSet {
    let mut caches = model.make_caches();
    let (body, last) = prefix.split_at(prefix.len() - 1);
    for chunk in [body, last] {
        if !chunk.is_empty() {
            let ids = Array::from_slice(chunk, &[1, chunk.len() as i32]);
            let out = model.forward(&ids, &mut caches, &[]).expect("forward");
            out.hidden.eval().expect("eval");
        }
    }
    save_prompt_cache(file, &caches, prefix, identity, &BTreeMap::new()).expect("save");
    let loaded = load_prompt_cache(file, model, identity).expect("load");
    assert_eq!(loaded.tokens.as_deref(), Some(prefix));
    loaded.caches
}

fn run(
    target: &dyn Target,
    prompt: &[u32],
    provider: Option<&dyn DraftProvider>,
    prefix: Option<CacheSet>,
) -> Result<Vec<u32>, ServeError> {
    let out = greedy_with(target, prompt, provider, 20, prefix, |_| {
        ControlFlow::Continue(())
    })?;
    Ok(out.tokens)
}

const PROMPT: &[u32] = &[40, 41, 42, 43, 9, 9, 40, 41, 42, 7, 8, 40, 41, 42];

/// Every provider's output from every cached prefix length equals plain
/// output without a cache.
fn check(model: &dyn Target, identity: &ModelIdentity, providers: &[(&str, ProviderOptions)]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = run(model, PROMPT, None, None).expect("plain");
    for k in [1, 6, PROMPT.len() - 1] {
        let file = dir.path().join(format!("prefix-{k}.safetensors"));
        let prefix = || cached(model, identity, &PROMPT[..k], &file);
        assert_eq!(
            run(model, PROMPT, None, Some(prefix())).expect("plain from a prefix"),
            plain,
            "plain, {k} tokens cached"
        );
        for (id, options) in providers {
            let provider = serve_loop::build_provider(id, model, options).expect("provider");
            assert_eq!(
                run(model, PROMPT, Some(provider.as_ref()), Some(prefix())).expect(id),
                plain,
                "{id}, {k} tokens cached"
            );
        }
    }
}

#[test]
fn llama_requests_from_a_cached_prefix_equal_plain_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, drafter_dir) = (dir.path().join("target"), dir.path().join("drafter"));
    for d in [&target_dir, &drafter_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    mlx_spec_scenarios::write_tiny_llama(&target_dir, 7).expect("write");
    mlx_spec_scenarios::write_tiny_llama(&drafter_dir, 8).expect("write");
    let (model, identity) = load(&target_dir);
    let mut drafter = ProviderOptions::new();
    drafter.insert("model".into(), drafter_dir.to_string_lossy().into_owned());
    check(
        &model,
        &identity,
        &[
            ("prompt-lookup", ProviderOptions::new()),
            ("suffix", ProviderOptions::new()),
            ("draft-model", drafter),
        ],
    );
}

#[test]
fn glm_requests_from_a_cached_prefix_equal_plain_output() {
    for spec in [Glm::default(), Glm::glm52_tiny()] {
        let dir = tempfile::tempdir().expect("tempdir");
        spec.write(dir.path()).expect("write");
        let (model, identity) = load(dir.path());
        check(
            &model,
            &identity,
            &[("glm52-native-mtp", ProviderOptions::new())],
        );
    }
}

#[test]
fn gemma4_requests_from_a_prefix_past_the_window_equal_plain_output() {
    use mlx_spec_scenarios::{
        write_tiny_assistant, write_tiny_gemma4, AssistantHead, Gemma4Variant,
    };
    const WINDOW: usize = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let (target_dir, assistant_dir) = (dir.path().join("target"), dir.path().join("assistant"));
    for d in [&target_dir, &assistant_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    write_tiny_gemma4(&target_dir, 5, Gemma4Variant::Text, WINDOW).expect("write");
    write_tiny_assistant(&assistant_dir, 3, AssistantHead::Tied, 64, 96, WINDOW).expect("write");
    let (model, identity) = load(&target_dir);
    let mut assistant = ProviderOptions::new();
    assistant.insert("model".into(), assistant_dir.to_string_lossy().into_owned());
    check(
        &model,
        &identity,
        &[
            ("prompt-lookup", ProviderOptions::new()),
            ("gemma4-assistant", assistant),
        ],
    );
}

#[test]
fn a_whole_prompt_prefix_and_a_tapping_provider_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    mlx_spec_scenarios::write_tiny_llama(dir.path(), 7).expect("write");
    let (model, identity) = load(dir.path());
    let file = dir.path().join("cache.safetensors");
    let whole = cached(&model, &identity, PROMPT, &file);
    let err = run(&model, PROMPT, None, Some(whole)).expect_err("nothing left to run");
    assert!(matches!(err, ServeError::PrefixTooLong { .. }), "{err}");
    let part = cached(&model, &identity, &PROMPT[..5], &file);
    let err = run(&model, PROMPT, Some(&Tapping), Some(part)).expect_err("taps");
    assert!(
        matches!(err, ServeError::PrefixWithTaps { ref provider } if provider == "tapping"),
        "{err}"
    );
    assert!(err.to_string().contains("`tapping`"), "{err}");
}
