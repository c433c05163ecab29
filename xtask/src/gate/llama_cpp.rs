//! llama.cpp's own files for gate `gguf`: its vocabulary tests
//! (`models/ggml-vocab-*`) and its Hugging Face -> GGUF converter
//! (`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/`). They come from PyPI
//! inside `llama-cpp-python`'s sdist, which vendors llama.cpp at a fixed
//! commit, unpacked once into the shared cache
//! (`~/.cache/mlx-spec/llama-cpp-VERSION/llama.cpp`).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use crate::{shell, venv};

/// What `pip download` fetches.
const SDIST: &str = "llama-cpp-python==0.3.36";

/// The parts of the vendored llama.cpp unpacked.
const PARTS: &[&str] = &[
    "models/ggml-vocab-*",
    "convert_hf_to_gguf.py",
    "conversion/*",
    "gguf-py/gguf/*",
];

/// Written once the files are unpacked; holds [`inputs`].
const READY: &str = "xtask-llama-cpp.txt";

fn inputs() -> String {
    let mut text = format!("{SDIST}\n");
    for part in PARTS {
        text.push_str(part);
        text.push('\n');
    }
    text
}

/// The unpacked llama.cpp directory, fetched on first use.
pub fn ensure() -> Result<PathBuf> {
    let root = spec_hub::cache_root().context("locating the cache directory")?;
    let dir = root.join(format!("llama-cpp-{}", SDIST.replace("==", "-")));
    let llama_cpp = dir.join("llama.cpp");
    let ready = dir.join(READY);
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(inputs().as_str()) {
        return Ok(llama_cpp);
    }
    let python = venv::ensure()?;
    eprintln!(
        "fetching llama.cpp's files ({SDIST}) into {}",
        dir.display()
    );
    let download = dir.join("download");
    for stale in [&download, &llama_cpp] {
        if stale.exists() {
            std::fs::remove_dir_all(stale)
                .with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    std::fs::create_dir_all(&download)?;
    shell::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
            ])
            .arg(&download)
            .arg(SDIST),
    )
    .context("fetching the llama-cpp-python sdist")?;
    let sdist = std::fs::read_dir(&download)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .with_context(|| format!("pip download left no .tar.gz in {}", download.display()))?;
    let mut tar = Command::new("tar");
    tar.arg("-xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&download)
        .arg("--wildcards");
    for part in PARTS {
        tar.arg(format!("*/vendor/llama.cpp/{part}"));
    }
    shell::run(&mut tar).context("unpacking llama.cpp's files")?;
    let unpacked = std::fs::read_dir(&download)?
        .flatten()
        .map(|e| e.path().join("vendor").join("llama.cpp"))
        .find(|p| p.join("convert_hf_to_gguf.py").is_file())
        .with_context(|| format!("no vendor/llama.cpp under {}", download.display()))?;
    std::fs::rename(&unpacked, &llama_cpp)?;
    std::fs::remove_dir_all(&download)?;
    std::fs::write(&ready, inputs())?;
    Ok(llama_cpp)
}
