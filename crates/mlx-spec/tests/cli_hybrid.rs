//! `mlx-spec generate` on a tiny `qwen3_next` checkpoint (random weights, a
//! word-level tokenizer of its 96 ids): plain decoding runs, speculation
//! gives its text (the recurrent states roll back exactly); a prompt-cache
//! file holds the recurrent states and continues the prompt; a pipeline of
//! two ranks gives the single process's text, plainly and speculating.

mod common;

use common::{mlx_spec, write_tokenizer};

use spec_fixtures::qwen3_next::GATE;

fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    GATE.tiny(5).write(dir.path()).expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    dir
}

fn generate_args(model: &str) -> Vec<&str> {
    raw_generate(model, "w5 w6 w7 w8", "16")
}

/// `generate` of the raw `prompt` (no template) for `max_tokens`.
fn raw_generate<'a>(model: &'a str, prompt: &'a str, max_tokens: &'a str) -> Vec<&'a str> {
    vec![
        "generate",
        "--model",
        model,
        "--prompt",
        prompt,
        "--no-chat-template",
        "--max-tokens",
        max_tokens,
    ]
}

/// `cache-prompt` of `text` (raw, with `extra` flags) into a file beside
/// the model, not in its directory (whose safetensors are its weights):
/// the directory holding it and the file's path.
fn cache_prompt(model: &str, text: &str, extra: &[&str]) -> (tempfile::TempDir, String) {
    let out = tempfile::tempdir().expect("tempdir");
    let prompt = out.path().join("prompt.txt");
    std::fs::write(&prompt, text).expect("prompt");
    let file = out.path().join("cache.safetensors");
    let file = file.to_str().expect("utf-8 path").to_owned();
    let mut args = vec![
        "cache-prompt",
        "--model",
        model,
        "--prompt-file",
        prompt.to_str().expect("utf-8 path"),
        "--no-chat-template",
        "--out",
        &file,
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = mlx_spec(&args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Saved"), "{stdout}");
    (out, file)
}

#[test]
fn plain_decoding_runs_and_is_repeatable() {
    let dir = checkpoint();
    let model = dir.path().to_str().expect("utf-8 path");
    let (ok, first, stderr) = mlx_spec(&generate_args(model));
    assert!(ok, "{stderr}");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    assert!(!text(&first).trim().is_empty(), "{first}");
    let (ok, second, stderr) = mlx_spec(&generate_args(model));
    assert!(ok, "{stderr}");
    assert_eq!(text(&first), text(&second));
}

#[test]
fn every_draft_provider_gives_plain_decodings_text() {
    let dir = checkpoint();
    let model = dir.path().to_str().expect("utf-8 path");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    let (ok, plain, stderr) = mlx_spec(&generate_args(model));
    assert!(ok, "{stderr}");
    for provider in ["prompt-lookup", "suffix"] {
        let mut args = generate_args(model);
        args.extend(["--draft", provider, "--num-draft", "4"]);
        let (ok, out, stderr) = mlx_spec(&args);
        assert!(ok, "{provider}: {stderr}");
        assert_eq!(text(&out), text(&plain), "{provider}");
    }
}

#[test]
fn a_cached_prompt_is_continued_as_the_whole_prompt_is() {
    // The file holds the recurrent states (mlx-lm's `ArraysCache`) beside
    // the attention layers' keys and values.
    let dir = checkpoint();
    let model = dir.path().to_str().expect("utf-8 path");
    let (_out, file) = cache_prompt(model, "w1 w2 w3 w4 w5", &[]);
    let file = file.as_str();
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    let ask = |prompt: &'static str, cached: bool| {
        let mut args = raw_generate(model, prompt, "12");
        if cached {
            args.extend(["--prompt-cache-file", file]);
        }
        args
    };
    let (ok, whole, stderr) = mlx_spec(&ask("w1 w2 w3 w4 w5 w6 w7", false));
    assert!(ok, "{stderr}");
    let (ok, cached, stderr) = mlx_spec(&ask(" w6 w7", true));
    assert!(ok, "{stderr}");
    assert!(cached.contains("cached)"), "{cached}");
    assert_eq!(text(&cached), text(&whole));
    let mut speculative = ask(" w6 w7", true);
    speculative.extend(["--draft", "prompt-lookup"]);
    let (ok, out, stderr) = mlx_spec(&speculative);
    assert!(ok, "{stderr}");
    assert_eq!(text(&out), text(&whole));
}

#[test]
fn a_pipeline_of_2_ranks_gives_the_single_process_text_with_every_provider() {
    // Recurrent caches on both ranks: rank 0 holds layers 2-3 (a Gated
    // DeltaNet layer among them), rank 1 layers 0-1.
    let dir = checkpoint();
    let model = dir.path().to_str().expect("utf-8 path");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    for draft in [
        &[][..],
        &["--draft", "prompt-lookup"][..],
        &["--draft", "suffix"][..],
    ] {
        let mut single = generate_args(model);
        single.extend(draft);
        let (ok, want, stderr) = mlx_spec(&single);
        assert!(ok, "{stderr}");
        let mut args = vec!["launch", "--np", "2", "--"];
        args.extend(single);
        args.push("--pipeline");
        let (ok, got, stderr) = mlx_spec(&args);
        assert!(ok, "{draft:?}: {stderr}");
        assert!(got.contains("Pipeline: 2 ranks"), "{got}");
        assert_eq!(text(&got), text(&want), "{draft:?}");
    }
}

/// `--max-kv-size 10` bounds the attention layers' caches (the first 4
/// positions and the last 6): speculation gives plain decoding's text under
/// the bound, which differs from the unbounded text; a prompt-cache file of
/// the bounded caches (mlx-lm's `RotatingKVCache` beside the recurrent
/// states) continues the prompt as the whole prompt does.
#[test]
fn bounded_attention_caches_stay_exact_and_round_trip() {
    let dir = checkpoint();
    let model = dir.path().to_str().expect("utf-8 path");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    let prompt = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12";
    let run = |extra: &[&str]| {
        let mut args = raw_generate(model, prompt, "24");
        args.extend_from_slice(extra);
        let (ok, out, stderr) = mlx_spec(&args);
        assert!(ok, "{extra:?}: {stderr}");
        text(&out)
    };
    let bounded = run(&["--max-kv-size", "10"]);
    assert_ne!(bounded, run(&[]), "the bound changes what the model sees");
    for provider in ["prompt-lookup", "suffix"] {
        let drafted = run(&[
            "--max-kv-size",
            "10",
            "--draft",
            provider,
            "--num-draft",
            "6",
        ]);
        assert_eq!(drafted, bounded, "{provider}");
    }
    let (_out, file) = cache_prompt(
        model,
        "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11",
        &["--max-kv-size", "10"],
    );
    let file = file.as_str();
    let mut args = raw_generate(model, " w12", "24");
    args.extend(["--max-kv-size", "10", "--prompt-cache-file", file]);
    let (ok, cached, stderr) = mlx_spec(&args);
    assert!(ok, "{stderr}");
    assert!(cached.contains("cached)"), "{cached}");
    assert_eq!(text(&cached), bounded);
}
