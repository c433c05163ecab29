//! Helpers shared by the CLI tests: running the binary, a word-level
//! tokenizer for synthetic checkpoints, finding processes a test started.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `mlx-spec ARGS`: success, stdout, stderr.
pub fn mlx_spec(args: &[&str]) -> (bool, String, String) {
    let (out, _) = mlx_spec_env(args, &[]);
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Runs `mlx-spec ARGS` with extra environment variables; the output and
/// how long it took.
pub fn mlx_spec_env(args: &[&str], envs: &[(&str, &str)]) -> (Output, Duration) {
    let start = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-spec"));
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run mlx-spec");
    (out, start.elapsed())
}

/// Bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A `WordLevel` tokenizer of `vocab` words `w0..` in `dir`.
pub fn write_tokenizer(dir: &Path, vocab: usize) {
    let words: serde_json::Map<String, serde_json::Value> = (0..vocab)
        .map(|i| (format!("w{i}"), serde_json::json!(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "w0"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("tokenizer.json");
}

/// Processes whose environment holds `MLX_SPEC_TEST_MARK=mark` (none may
/// outlive the command that started them).
pub fn processes_marked(mark: &str) -> Vec<String> {
    let needle = format!("MLX_SPEC_TEST_MARK={mark}");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}
