//! `mlx-spec serve --prompt-cache-dir` over loopback: a chat's first turn
//! leaves its caches as a prompt-cache file; after a restart on the same
//! directory (beside a corrupt file and another model's), the next turn
//! starts from it (`cached_tokens` > 0) and answers what a cold server
//! answers; the two bad files are skipped with a warning naming each. The
//! files are written off the engine thread; a SIGTERM writes the queued
//! ones before the server exits.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

mod common;

use common::{http_post, served_address};

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

    let corrupt = dir.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json").expect("write");
    let other = dir.path().join("other-model.safetensors");
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
