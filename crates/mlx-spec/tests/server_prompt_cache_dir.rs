//! `mlx-spec serve --prompt-cache-dir` over loopback: a chat's first turn
//! leaves its caches as a prompt-cache file; after a restart on the same
//! directory (beside a corrupt file and another model's), the next turn
//! starts from it (`cached_tokens` > 0) and answers what a cold server
//! answers; the two bad files are skipped with a warning naming each.
//! Files the server did not write (a model shard, say) are never counted,
//! read or deleted, whatever the budget, and a second server on the same
//! directory is refused while the first holds it. The
//! files are written off the engine thread; a SIGTERM writes the queued
//! ones before the server exits. A `draft-model` drafter's state persists
//! beside its entry: after a restart the hit restores it, as a hit without
//! a restart does.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

mod common;

use common::{http_post, metric, served_address, write_tokenizer};

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Stops the server; what it wrote to stderr.
    fn stop(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut err = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Server {
    /// Stops the server as a service manager does (SIGTERM) and waits for it
    /// (at most a minute): a graceful stop writes the queued entries.
    fn terminate(mut self) -> String {
        let pid = self.0.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match self.0.try_wait().expect("wait") {
                Some(exit) => {
                    assert!(exit.success(), "the server failed to stop: {exit}");
                    break;
                }
                None if std::time::Instant::now() > deadline => {
                    panic!("the server did not stop within a minute of SIGTERM")
                }
                None => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
        self.stop()
    }
}

fn start(args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0"])
        .args(args)
        .env("MLX_SPEC_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = served_address(&mut child);
    (Server(child), addr)
}

fn chat(addr: &str, messages: &Value) -> Value {
    let body = json!({"messages": messages, "max_tokens": 24, "temperature": 0});
    let (status, answer) = http_post(addr, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the cache dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    out.sort();
    out
}

/// A copy of `file` whose fingerprint names another model (one hex digit
/// of it changed in the header: the header's length stays the same).
fn other_models_copy(file: &Path, to: &Path) {
    let mut bytes = std::fs::read(file).expect("read");
    let key = b"mlx_spec_fingerprint\":\"";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("a fingerprint in the header")
        + key.len();
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(to, bytes).expect("write");
}

#[test]
fn entries_survive_a_restart_and_bad_files_are_skipped_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache_dir = dir.path().to_string_lossy().into_owned();
    let with_dir = ["--prompt-cache-dir", cache_dir.as_str()];
    let first_turn = json!([{"role": "user", "content": "Name three rivers of Europe."}]);

    let (server, addr) = start(&with_dir);
    let first = chat(&addr, &first_turn);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Entries are written off the engine thread; a graceful stop writes
    // what is queued, renamed into place (no partial file left).
    server.terminate();
    let kept = files(dir.path());
    assert!(!kept.is_empty(), "no prompt-cache file was written");
    assert!(
        kept.iter()
            .all(|p| !p.to_string_lossy().contains(".partial.")),
        "a partial file was left: {kept:?}"
    );

    // Named as entries are: a corrupt file, and another model's entry.
    let corrupt = dir.path().join("0000000000000000.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json").expect("write");
    let other = dir.path().join("ffffffffffffffff.safetensors");
    other_models_copy(&kept[0], &other);

    let answer = first["choices"][0]["message"]["content"].clone();
    let next_turn = json!([
        {"role": "user", "content": "Name three rivers of Europe."},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Which of them is the longest?"}
    ]);
    let (server, addr) = start(&with_dir);
    let warm = chat(&addr, &next_turn);
    let log = server.stop();
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    assert!(
        cached > 0,
        "the next turn after a restart hit nothing: {warm}"
    );
    for bad in [&corrupt, &other] {
        let name = bad
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            log.contains(&name) && log.contains("skipping prompt-cache file"),
            "no warning naming {name}:\n{log}"
        );
    }

    let (server, addr) = start(&["--prompt-cache-bytes", "0"]);
    let cold = chat(&addr, &next_turn);
    server.stop();
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        warm["choices"][0]["message"]["content"],
        cold["choices"][0]["message"]["content"]
    );
    assert_eq!(
        warm["usage"]["prompt_tokens"],
        cold["usage"]["prompt_tokens"]
    );
}

/// A tiny llama with a word-level tokenizer of its 96 words.
fn tiny_llama(dir: &Path, seed: u64) {
    std::fs::create_dir(dir).expect("mkdir");
    spec_fixtures::llama::Llama::tiny(seed)
        .write(dir)
        .expect("checkpoint");
    write_tokenizer(dir, 96);
}

/// A completion drafted by `draft-model` with the per-row controller: its
/// draft counts depend on the tokens only (the goodput policy's on timing).
fn complete(addr: &str, prompt: &str) -> Value {
    let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0,
        "speculative": {"provider": "draft-model", "draft_policy": "per-row"}});
    let (status, answer) = http_post(addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

fn cached(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

/// `draft-model` keeps its drafter's cache on its own 2048-token grid, so
/// the prompts pass 2048 tokens. A's entry and its drafter state are
/// written; after a restart B (A and a few more words) hits at A's length
/// and its drafter starts from the persisted state (the restore metric),
/// drafting what the same hit without a restart drafts and answering what
/// a cold server answers.
#[test]
fn a_draft_model_state_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (target, drafter) = (dir.path().join("target"), dir.path().join("drafter"));
    tiny_llama(&target, 7);
    tiny_llama(&drafter, 8);
    let cache_dir = dir.path().join("cache");
    let words = |n: u32| -> Vec<String> {
        (0..n)
            .map(|i| format!("w{}", (i * 7 + i / 11) % 90 + 1))
            .collect()
    };
    let a = words(2100).join(" ");
    let b = format!("{a} w5 w6 w7 w8 w9 w40 w41");
    let drafter_option = format!("draft-model:model={}", drafter.display());
    // `cache`: "dir" (the directory), "memory" (no directory) or "off".
    let run = |cache: &str| {
        let mut args: Vec<String> = [
            "--model",
            &target.to_string_lossy(),
            "--draft-provider",
            "draft-model",
            "--draft-option",
            &drafter_option,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match cache {
            "dir" => args.extend([
                "--prompt-cache-dir".into(),
                cache_dir.to_string_lossy().into_owned(),
            ]),
            "off" => args.extend(["--prompt-cache-bytes".into(), "0".into()]),
            _ => {}
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        start(&refs)
    };
    let restores = |addr: &str| metric(addr, "mlx_spec_prefix_cache_draft_restores_total");

    // A leaves its entry and drafter state in the directory.
    let (server, addr) = run("dir");
    assert_eq!(cached(&complete(&addr, &a)), 0);
    server.terminate();
    let states: Vec<_> = std::fs::read_dir(&cache_dir)
        .expect("read")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with(".draft-model.draft.safetensors")
        })
        .collect();
    assert!(!states.is_empty(), "no drafter state was written");

    // Restart: B from the files.
    let (server, addr) = run("dir");
    let restarted = complete(&addr, &b);
    assert_eq!(
        restores(&addr),
        1.0,
        "the drafter state did not survive the restart"
    );
    server.terminate();

    // No restart: A, then B from memory.
    let (server, addr) = run("memory");
    complete(&addr, &a);
    let kept = complete(&addr, &b);
    assert_eq!(restores(&addr), 1.0);
    server.stop();
    assert!(cached(&restarted) >= 2100, "{restarted}");
    assert_eq!(cached(&restarted), cached(&kept));
    assert_eq!(restarted["speculative"], kept["speculative"]);

    let (server, addr) = run("off");
    let cold = complete(&addr, &b);
    server.stop();
    assert_eq!(cached(&cold), 0);
    assert_eq!(restarted["choices"][0]["text"], cold["choices"][0]["text"]);
    assert_eq!(
        restarted["speculative"]["drafted"],
        cold["speculative"]["drafted"]
    );
}

/// Files of the server's name pattern it did not write, and files of other
/// names, survive a budget far below their size: none is read, counted or
/// deleted (a model shard in the directory once was). A second server on
/// the directory is refused, naming it, while the first one runs.
#[test]
fn files_not_ours_are_never_touched_and_the_directory_is_locked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shard = dir.path().join("model-00001-of-00002.safetensors");
    let shard_bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&shard, &shard_bytes).expect("write the shard");
    // Named as an entry is, a partial and a draft state are: no marker.
    let unmarked = dir.path().join("0123456789abcdef.safetensors");
    std::fs::write(&unmarked, b"\x02\x00\x00\x00\x00\x00\x00\x00{}").expect("write");
    let notes = dir.path().join("notes.partial.safetensors");
    std::fs::write(&notes, b"keep me").expect("write");
    let foreign_draft = dir.path().join("weights.draft.safetensors");
    std::fs::write(&foreign_draft, b"keep me too").expect("write");
    let before: Vec<(PathBuf, Vec<u8>)> = [&shard, &unmarked, &notes, &foreign_draft]
        .iter()
        .map(|p| (p.to_path_buf(), std::fs::read(p).expect("read")))
        .collect();

    let cache_dir = dir.path().to_string_lossy().into_owned();
    let args = [
        "--prompt-cache-dir",
        cache_dir.as_str(),
        "--prompt-cache-dir-bytes",
        "1000",
    ];
    let (server, addr) = start(&args);
    chat(
        &addr,
        &json!([{"role": "user", "content": "Name three rivers of Europe."}]),
    );

    let second = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0"])
        .args(args)
        .env("MLX_SPEC_LOG", "warn")
        .output()
        .expect("run a second server");
    let second_err = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success()
            && second_err.contains("in use")
            && second_err.contains(&cache_dir),
        "a second server on a held directory: {}\n{second_err}",
        second.status
    );

    server.terminate();
    for (path, bytes) in &before {
        let now = std::fs::read(path).unwrap_or_else(|e| panic!("{} is gone: {e}", path.display()));
        assert!(&now == bytes, "{} was changed", path.display());
    }
}
