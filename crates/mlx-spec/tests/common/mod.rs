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

/// Writes a byte-level BPE `tokenizer.json` of 96 single-byte tokens (no
/// merges) into `dir`: printable ASCII `!`..`~` as ids 0..94, then space
/// and newline. Constrained decoding reads its token bytes.
pub fn write_byte_tokenizer(dir: &Path) {
    let mut words: serde_json::Map<String, serde_json::Value> = (0u32..94)
        .map(|i| {
            let c = char::from_u32(33 + i).unwrap_or('?');
            (c.to_string(), serde_json::json!(i))
        })
        .collect();
    // GPT-2's byte-to-character map: space is U+0120, newline U+010A.
    words.insert("\u{120}".to_string(), serde_json::json!(94));
    words.insert("\u{10a}".to_string(), serde_json::json!(95));
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": true});
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "vocab": words, "merges": [], "dropout": null,
            "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false},
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

/// Reads the address `mlx-spec serve --port 0` prints first (`http://ADDR`)
/// from `child`'s stdout (piped).
pub fn served_address(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut first = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut first)
        .expect("the address line");
    first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("no address in `{first}`"))
        .to_owned()
}

/// Sends one HTTP/1.1 request to `addr` (loopback) and returns the stream
/// to read the answer from (the connection closes after it).
pub fn http_send(addr: &str, method: &str, path: &str, body: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    stream
}

/// POSTs `body` to `path`: the status and the JSON body.
pub fn http_post(addr: &str, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    use std::io::Read;
    let mut stream = http_send(addr, "POST", path, &body.to_string());
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let (_, json) = response.split_once("\r\n\r\n").expect("a body");
    (status, serde_json::from_str(json).expect("a JSON body"))
}

/// POSTs a streaming `body` to `path` and reads `chunks` of its data lines;
/// the rest of the stream is left unread.
pub fn stream_chunks(
    addr: &str,
    path: &str,
    body: &serde_json::Value,
    chunks: usize,
) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(http_send(addr, "POST", path, &body.to_string()));
    let mut line = String::new();
    let mut read = 0;
    while read < chunks {
        line.clear();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "the stream ended early"
        );
        read += usize::from(line.starts_with("data: {"));
    }
    reader
}

/// Waits (at most 10 s) until the engine at `addr` holds no request.
pub fn wait_engine_idle(addr: &str) {
    let since = std::time::Instant::now();
    while metric(addr, "mlx_spec_engine_held") != 0.0 {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the rows were not freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A metric's value from `/metrics` at `addr`.
pub fn metric(addr: &str, name: &str) -> f64 {
    use std::io::Read;
    let mut stream = http_send(addr, "GET", "/metrics", "");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// A tiny llama whose word-level tokenizer (`w0`..`w95`) carries `template`.
pub fn tiny_llama_with_template(dir: &Path, template: &str) {
    spec_fixtures::llama::Llama::tiny(7)
        .write(dir)
        .expect("checkpoint");
    write_tokenizer(dir, 96);
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template}).to_string(),
    )
    .expect("tokenizer_config.json");
}

/// A tiny GLM (3 layers, its MTP row) with a word-level tokenizer of its
/// vocabulary, in a temporary directory.
pub fn tiny_glm() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::glm::Glm {
        layers: 3,
        ..spec_fixtures::glm::Glm::default()
    }
    .write(dir.path())
    .expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    dir
}

/// The process of rank `rank` among those marked `mark` (see
/// [`processes_marked`]).
pub fn rank_process(mark: &str, rank: usize) -> Option<String> {
    let needle = format!("MLX_RANK={rank}");
    processes_marked(mark).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
            .unwrap_or(false)
    })
}

/// A running `mlx-spec serve`, killed when dropped (the test passing or not).
pub struct Served(pub std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `mlx-spec serve --port 0 ARGS` on the default model; returns it
/// and its loopback address.
pub fn serve(args: &[&str]) -> (Served, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = served_address(&mut child);
    (Served(child), addr)
}

/// What `generate` printed before its statistics (the line `==========`):
/// the generated text.
pub fn generated_text(stdout: &str) -> String {
    stdout
        .lines()
        .take_while(|l| *l != "==========")
        .collect::<Vec<_>>()
        .join("\n")
}
