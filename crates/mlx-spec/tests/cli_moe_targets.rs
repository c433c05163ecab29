//! `mlx-spec generate` on tiny mixture-of-experts checkpoints of the llama
//! family (random weights, a word-level tokenizer of their 96 ids):
//! `qwen3_moe` in Hugging Face's per-expert layout, where speculation,
//! streamed experts and both together give plain decoding's text, and a
//! dense llama refuses `--expert-cache-bytes` by name; `gpt_oss` past its
//! sliding window, where every provider gives plain decoding's text (its
//! own copy drafting, and with streamed experts) and `--kv-bits` is
//! refused by name.

mod common;

use common::{mlx_spec, write_tokenizer};

use spec_fixtures::llama::{Llama, GATE_GPT_OSS, GATE_QWEN3_MOE};

/// One expert layer's experts are 8 x 3 projections of 32 x 64 floats: a
/// tier of one layer and a bit, so the two expert layers evict each other.
const TIER: &str = "200000";

/// `spec` at three layers and the tokenizer's 96 ids, with a tokenizer.
fn checkpoint(spec: Llama) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    Llama {
        layers: 3,
        vocab: 96,
        ..spec
    }
    .write(dir.path())
    .expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    dir
}

fn generate(model: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "generate",
        "--model",
        model,
        "--prompt",
        "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6",
        "--no-chat-template",
        "--max-tokens",
        "24",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = mlx_spec(&args);
    assert!(ok, "{extra:?}: {stderr}");
    // The text, without the stats line after it.
    match stdout.split_once("\n==========") {
        Some((text, _)) => text.to_owned(),
        None => panic!("{extra:?}: no stats line in {stdout}"),
    }
}

/// The standard error of a `generate` that `extra` makes fail.
fn refused(model: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "generate",
        "--model",
        model,
        "--prompt",
        "w1 w2",
        "--no-chat-template",
    ];
    args.extend_from_slice(extra);
    let (ok, _, stderr) = mlx_spec(&args);
    assert!(!ok, "{extra:?} succeeded");
    stderr
}

#[test]
fn speculation_and_streamed_experts_give_plain_decodings_text() {
    let dir = checkpoint(GATE_QWEN3_MOE);
    let model = dir.path().to_str().expect("utf-8 path");
    let plain = generate(model, &[]);
    assert!(plain.contains('w'), "{plain}");
    for extra in [
        &["--draft", "prompt-lookup"][..],
        &["--draft", "suffix"],
        &["--expert-cache-bytes", TIER],
        &["--expert-cache-bytes", TIER, "--draft", "prompt-lookup"],
    ] {
        assert_eq!(generate(model, extra), plain, "{extra:?}");
    }
}

#[test]
fn a_dense_llama_refuses_streamed_experts_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    Llama::tiny(4).write(dir.path()).expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    let model = dir.path().to_str().expect("utf-8 path");
    let stderr = refused(model, &["--expert-cache-bytes", TIER]);
    assert!(
        stderr.contains("--expert-cache-bytes") && stderr.contains("no routed experts"),
        "{stderr}"
    );
}

#[test]
fn gpt_oss_speculates_past_its_window_streams_and_refuses_quantized_caches() {
    let dir = checkpoint(GATE_GPT_OSS);
    let model = dir.path().to_str().expect("utf-8 path");
    let plain = generate(model, &[]);
    for extra in [
        &["--draft", "prompt-lookup"][..],
        &["--draft", "suffix"],
        &["--draft-model", model],
        &["--expert-cache-bytes", TIER, "--draft", "prompt-lookup"],
    ] {
        assert_eq!(generate(model, extra), plain, "{extra:?}");
    }
    let stderr = refused(model, &["--kv-bits", "4"]);
    assert!(
        stderr.contains("--kv-bits") && stderr.contains("sinks"),
        "{stderr}"
    );
}
