//! `--model org/name` finds the snapshot the local Hugging Face cache holds
//! (laid out as `huggingface_hub` writes it: files linked into `blobs/`),
//! for `generate`, a drafter's `model` and `serve`; a repo id it does not
//! hold is an error saying how to fetch it.

mod common;

use std::path::Path;

use common::{mlx_spec_env, text, tiny_llama_with_template};

const HASH: &str = "5d0f7b9a7c1e2d3f4a5b6c7d8e9f0a1b2c3d4e5f";

/// A hub cache holding `acme/tiny-llama`; returns its root.
fn hub_cache(root: &Path) -> std::path::PathBuf {
    let staged = root.join("staged");
    std::fs::create_dir_all(&staged).expect("mkdir");
    tiny_llama_with_template(
        &staged,
        "{% for m in messages %}{{ m.content }} {% endfor %}",
    );
    let hub = root.join("hub");
    let repo = hub.join("models--acme--tiny-llama");
    let blobs = repo.join("blobs");
    let snapshot = repo.join("snapshots").join(HASH);
    std::fs::create_dir_all(&blobs).expect("mkdir");
    std::fs::create_dir_all(&snapshot).expect("mkdir");
    for (i, entry) in std::fs::read_dir(&staged).expect("staged").enumerate() {
        let entry = entry.expect("entry");
        let blob = format!("blob{i}");
        std::fs::rename(entry.path(), blobs.join(&blob)).expect("move");
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(&blob),
            snapshot.join(entry.file_name()),
        )
        .expect("link");
    }
    std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
    std::fs::write(repo.join("refs").join("main"), HASH).expect("refs/main");
    hub
}

#[test]
fn a_repo_id_runs_from_the_hugging_face_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hub = hub_cache(tmp.path());
    let env = [("HF_HUB_CACHE", hub.to_str().expect("utf-8"))];
    let run = |args: &[&str]| {
        let (out, _) = mlx_spec_env(args, &env);
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let generate = [
        "generate",
        "--model",
        "acme/tiny-llama",
        "--prompt",
        "w1 w2 w3",
        "--max-tokens",
        "4",
    ];
    let (ok, stdout, stderr) = run(&generate);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Generation: 4 tokens"), "{stdout}");
    // The same repo id as a drafter's checkpoint.
    let mut with_drafter = generate.to_vec();
    with_drafter.extend(["--draft", "draft-model", "--draft-model", "acme/tiny-llama"]);
    let (ok, stdout, stderr) = run(&with_drafter);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Draft draft-model"), "{stdout}");

    let (ok, _, stderr) = run(&["generate", "--model", "acme/absent", "--prompt", "w1"]);
    assert!(!ok);
    assert!(
        stderr.contains("acme/absent") && stderr.contains("hf download acme/absent"),
        "{stderr}"
    );
}

#[test]
fn the_server_serves_a_cached_repo_under_its_id() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hub = hub_cache(tmp.path());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(["serve", "--port", "0", "--model", "acme/tiny-llama"])
        .env("HF_HUB_CACHE", &hub)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the server");
    let addr = common::served_address(&mut child);
    let _served = common::Served(child);
    let (status, body) = common::http_post(
        &addr,
        "/v1/completions",
        &serde_json::json!({"model": "acme/tiny-llama", "prompt": "w1 w2", "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "acme/tiny-llama", "{body}");
    // OpenAI's retrieve, the repo id's slash in the path.
    let get = |path: &str| {
        use std::io::Read;
        let mut answer = String::new();
        common::http_send(&addr, "GET", path, "")
            .read_to_string(&mut answer)
            .expect("answer");
        let status: u16 = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        (status, body)
    };
    let (status, body) = get("/v1/models/acme/tiny-llama");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""id":"acme/tiny-llama""#), "{body}");
    let (status, body) = get("/v1/models/acme/other");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("model_not_found"), "{body}");
}
