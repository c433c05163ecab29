//! `mlx-spec cache-prompt` then `generate --prompt-cache-file` on the real
//! default model: the cached run continues the prompt, speculation from the
//! file gives the same text, and a file computed under another dtype policy
//! is refused naming both fingerprints.

mod common;

use common::{generated_text as text, mlx_spec};

#[test]
fn a_cached_prompt_is_continued_and_guarded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = dir.path().join("prompt.txt");
    std::fs::write(
        &prompt,
        "Here is a document: the first bicycles appeared in Europe in the early nineteenth century.",
    )
    .expect("prompt");
    let file = dir.path().join("cache.safetensors");
    let file = file.to_str().expect("utf-8 path");
    let (ok, stdout, stderr) = mlx_spec(&[
        "cache-prompt",
        "--prompt-file",
        prompt.to_str().expect("utf-8 path"),
        "--out",
        file,
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Saved"), "{stdout}");
    let ask = [
        "generate",
        "--prompt-cache-file",
        file,
        "--prompt",
        " Where did they appear?",
        "--max-tokens",
        "12",
    ];
    let (ok, plain, stderr) = mlx_spec(&ask);
    assert!(ok, "{stderr}");
    assert!(text(&plain).contains("Europe"), "{plain}");
    assert!(plain.contains("cached)"), "{plain}");
    let (ok, speculative, stderr) = mlx_spec(&[&ask[..], &["--draft", "prompt-lookup"]].concat());
    assert!(ok, "{stderr}");
    assert_eq!(text(&speculative), text(&plain));
    let (ok, _, stderr) = mlx_spec(&[&ask[..], &["--keep-dtype"]].concat());
    assert!(!ok);
    assert!(
        stderr.contains("was written for model")
            && stderr.contains("dtype float32")
            && stderr.contains("dtype keep"),
        "{stderr}"
    );
}

/// `cache-prompt --kv-bits 4 --quantized-kv-start 0` writes quantized
/// caches that a `generate` with the same flags continues (speculation
/// giving the same text); a float run refuses the file naming mlx-lm's
/// class.
#[test]
fn a_quantized_kv_prompt_cache_needs_the_same_kv_bits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kv4.safetensors");
    let file = file.to_str().expect("utf-8 path");
    let (ok, stdout, stderr) = mlx_spec(&[
        "cache-prompt",
        "--prompt",
        "Here is a document: the first bicycles appeared in Europe in the early nineteenth century.",
        "--out",
        file,
        "--kv-bits",
        "4",
        "--quantized-kv-start",
        "0",
    ]);
    assert!(ok && stdout.contains("Saved"), "{stdout}{stderr}");
    let ask = [
        "generate",
        "--prompt-cache-file",
        file,
        "--prompt",
        " Where did they appear?",
        "--max-tokens",
        "12",
    ];
    let kv = ["--kv-bits", "4", "--quantized-kv-start", "0"];
    let (ok, plain, stderr) = mlx_spec(&[&ask[..], &kv[..]].concat());
    assert!(ok && plain.contains("cached)"), "{plain}{stderr}");
    let (ok, speculative, stderr) =
        mlx_spec(&[&ask[..], &kv[..], &["--draft", "prompt-lookup"]].concat());
    assert!(ok, "{stderr}");
    assert_eq!(text(&speculative), text(&plain));
    let (ok, _, stderr) = mlx_spec(&ask);
    assert!(!ok && stderr.contains("QuantizedKVCache"), "{stderr}");
}

/// `generate --prompt-cache-dir`: a second run of the same prompt starts
/// from the prefix the first left in the directory (its stats line counts
/// the cached tokens) and writes the same text, speculative or not; the
/// directory cannot be combined with a cache file.
#[test]
fn a_prompt_cache_dir_carries_prefixes_across_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let store = store.to_str().expect("utf-8 path");
    let ask = [
        "generate",
        "--prompt-cache-dir",
        store,
        "--prompt",
        "Name three colours of the rainbow.",
        "--max-tokens",
        "10",
    ];
    let (ok, first, stderr) = mlx_spec(&ask);
    assert!(ok, "{stderr}");
    assert!(!first.contains("cached)"), "nothing cached yet: {first}");
    let (ok, second, stderr) = mlx_spec(&ask);
    assert!(ok, "{stderr}");
    assert!(second.contains("cached)"), "{second}");
    assert_eq!(text(&second), text(&first));
    let (ok, speculative, stderr) = mlx_spec(&[&ask[..], &["--draft", "prompt-lookup"]].concat());
    assert!(ok, "{stderr}");
    assert!(speculative.contains("cached)"), "{speculative}");
    assert_eq!(text(&speculative), text(&first));
    let (ok, _, stderr) = mlx_spec(&[&ask[..], &["--prompt-cache-file", "x.safetensors"]].concat());
    assert!(!ok);
    assert!(stderr.contains("choose one"), "{stderr}");
}

/// `generate --prefill-step-size` sets the grid a directory's prefixes are
/// kept and found on: on a tiny GLM (whose prefill bits depend on the
/// split) a prompt sharing 7 tokens with the last run's starts from 4 of
/// them with steps of 4, from none with the default 512.
#[test]
fn the_prefill_step_sets_the_grid_of_a_prompt_cache_dir() {
    let model = common::tiny_glm();
    let model = model.path().to_str().expect("utf-8 path");
    let cached = |step: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().to_str().expect("utf-8 path");
        [
            "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10",
            "w1 w2 w3 w4 w5 w6 w7 w30 w31 w32",
        ]
        .iter()
        .map(|prompt| {
            let (ok, out, stderr) = mlx_spec(&[
                "generate",
                "--model",
                model,
                "--prompt-cache-dir",
                store,
                "--prompt",
                prompt,
                "-m",
                "2",
                "--prefill-step-size",
                step,
            ]);
            assert!(ok, "{stderr}");
            out.split_once("(+")
                .map(|(_, rest)| rest.split(' ').next().unwrap_or("").to_owned())
        })
        .collect::<Vec<_>>()
    };
    assert_eq!(cached("4"), [None, Some("4".to_owned())]);
    assert_eq!(cached("512"), [None, None]);
}

/// `--adapter-path` on the default model: a LoRA adapter on its last two
/// blocks changes the answer, prompt lookup gives the adapted model's
/// plain text, and a prompt cache written with the adapter is refused
/// without it (the adapter is part of the fingerprint) and continued with
/// it.
#[test]
fn an_adapter_changes_the_model_and_its_prompt_caches() {
    use spec_fixtures::adapter::LoraAdapter;
    use spec_fixtures::llama::{Llama, GATE_LLAMA};
    // SmolLM2-135M's shapes (the default model).
    let smollm2 = Llama {
        hidden: 576,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        intermediate: 1536,
        head_dim: None,
        ..GATE_LLAMA
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let adapter = dir.path().join("adapter");
    std::fs::create_dir(&adapter).expect("mkdir");
    LoraAdapter::lora(2, 11)
        .write(&adapter, &smollm2)
        .expect("adapter");
    let adapter = adapter.to_str().expect("utf-8 path");
    let ask = [
        "generate",
        "--prompt",
        "Name three colors of the rainbow.",
        "--max-tokens",
        "12",
    ];
    let with_adapter = [&ask[..], &["--adapter-path", adapter]].concat();
    let (ok, plain, stderr) = mlx_spec(&ask);
    assert!(ok, "{stderr}");
    let (ok, adapted, stderr) = mlx_spec(&with_adapter);
    assert!(ok, "{stderr}");
    assert_ne!(text(&adapted), text(&plain));
    let (ok, speculative, stderr) =
        mlx_spec(&[&with_adapter[..], &["--draft", "prompt-lookup"]].concat());
    assert!(ok, "{stderr}");
    assert_eq!(text(&speculative), text(&adapted));

    let file = dir.path().join("adapted.safetensors");
    let file = file.to_str().expect("utf-8 path");
    let (ok, stdout, stderr) = mlx_spec(&[
        "cache-prompt",
        "--prompt",
        "Here is a list of colors:",
        "--out",
        file,
        "--adapter-path",
        adapter,
    ]);
    assert!(ok && stdout.contains("Saved"), "{stdout}{stderr}");
    let cached = [
        "generate",
        "--prompt-cache-file",
        file,
        "--prompt",
        " red,",
        "--max-tokens",
        "4",
    ];
    let (ok, _, stderr) = mlx_spec(&cached);
    assert!(!ok && stderr.contains("was written for model"), "{stderr}");
    let (ok, stdout, stderr) = mlx_spec(&[&cached[..], &["--adapter-path", adapter]].concat());
    assert!(ok && stdout.contains("cached)"), "{stdout}{stderr}");
}
