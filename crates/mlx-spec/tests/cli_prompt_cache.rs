//! `mlx-spec cache-prompt` then `generate --prompt-cache-file` on the real
//! default model: the cached run continues the prompt, speculation from the
//! file gives the same text, and a file computed under another dtype policy
//! is refused naming both fingerprints.

mod common;

use common::mlx_spec;

fn text(stdout: &str) -> String {
    stdout
        .lines()
        .take_while(|l| *l != "==========")
        .collect::<Vec<_>>()
        .join("\n")
}

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
