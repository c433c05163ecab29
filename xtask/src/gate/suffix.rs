//! `cargo xtask gate suffix`: the `suffix` provider against arctic-inference
//! 0.3.0's suffix decoding (PyPI, source only), built here without torch:
//! - trie level (`xtask/python/suffix_oracle.py`): our `SuffixTrie`'s
//!   proposals equal the reference `SuffixTree.speculate` over random
//!   histories with removals, probabilities and scores included;
//! - cache level (`xtask/python/suffix_cache_oracle.py`): whole sessions of
//!   requests through one provider equal `SuffixDecodingCache.speculate`
//!   where the semantics agree (one test per session), and the documented
//!   differences (global tree grown per round vs at completion, request
//!   count FIFO vs token budget LRU) are counted and printed.
//!
//! The reference environment lives in the shared cache
//! (`~/.cache/mlx-spec/suffix-oracle-HASH`, HASH over its inputs): a venv
//! with nanobind and numpy, the unpacked sdist, and the extension `_C`
//! built from `csrc/suffix_decoding` with cmake. `pip download` of the
//! sdist stops at its metadata step (its `setup.py` imports torch) but
//! leaves the unpacked source under its temporary directory (`--no-clean`),
//! which is all the gate needs.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::Counts;
use crate::reference_env::fnv1a;
use crate::{shell, venv};

/// The reference: what `pip download` fetches.
const SDIST: &str = "arctic-inference==0.3.0";

/// The venv that builds and imports the extension.
const REQUIREMENTS: &[&str] = &["nanobind==3.1.0", "numpy==2.4.6"];

/// Written once the extension is built; holds the inputs it was built from.
const READY: &str = "xtask-suffix-oracle.txt";

fn inputs() -> String {
    let mut text = format!("{SDIST}\ncmake csrc/suffix_decoding\n");
    for r in REQUIREMENTS {
        text.push_str(r);
        text.push('\n');
    }
    text
}

/// The environment's directory, named by a hash of its inputs.
fn dir() -> Result<PathBuf> {
    let root = spec_hub::cache_root().context("locating the cache directory")?;
    Ok(root.join(format!("suffix-oracle-{:016x}", fnv1a(&inputs()))))
}

/// Builds the reference when needed; returns (python, the unpacked sdist
/// with `_C` in `arctic_inference/suffix_decoding/`).
fn ensure() -> Result<(PathBuf, PathBuf)> {
    let dir = dir()?;
    let python = venv::pinned(&dir.join("venv"), "suffix oracle environment", REQUIREMENTS)?;
    let src = dir.join("arctic-inference");
    let ready = dir.join(READY);
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(inputs().as_str()) {
        return Ok((python, src));
    }
    eprintln!(
        "building the suffix-decoding reference in {}",
        dir.display()
    );
    let start = std::time::Instant::now();
    let download = dir.join("download");
    for stale in [&download, &src, &dir.join("build")] {
        if stale.exists() {
            std::fs::remove_dir_all(stale)
                .with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    std::fs::create_dir_all(&download)?;
    // Expected to fail at the metadata step (see the module doc); the
    // source it unpacked is checked below instead of the exit status.
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--no-clean",
            "-d",
        ])
        .arg(&download)
        .arg(SDIST)
        .env("TMPDIR", &download)
        .stderr(std::process::Stdio::null())
        .status()
        .context("running pip download")?;
    let unpacked = find_unpacked(&download)?.with_context(|| {
        format!(
            "pip download {SDIST} (exit {status}) left no unpacked source under {}",
            download.display()
        )
    })?;
    let pkg_info = std::fs::read_to_string(unpacked.join("PKG-INFO"))
        .with_context(|| format!("reading {}/PKG-INFO", unpacked.display()))?;
    if !pkg_info
        .lines()
        .any(|l| l == "Name: arctic_inference" || l == "Name: arctic-inference")
        || !pkg_info.lines().any(|l| l == "Version: 0.3.0")
    {
        bail!("{} is not arctic-inference 0.3.0", unpacked.display());
    }
    std::fs::rename(&unpacked, &src)?;
    std::fs::remove_dir_all(&download)?;
    let build = dir.join("build");
    shell::run(
        Command::new("cmake")
            .arg("-S")
            .arg(src.join("csrc").join("suffix_decoding"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DPython_EXECUTABLE={}", python.display()))
            .arg("-DCMAKE_BUILD_TYPE=Release"),
    )?;
    shell::run(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .args(["--parallel", "2"]),
    )?;
    let module = std::fs::read_dir(&build)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("_C.") && n.ends_with(".so"))
        })
        .with_context(|| format!("no _C*.so in {}", build.display()))?;
    let name = module.file_name().context("module name")?;
    std::fs::copy(
        &module,
        src.join("arctic_inference")
            .join("suffix_decoding")
            .join(name),
    )?;
    std::fs::write(&ready, inputs())?;
    eprintln!(
        "suffix-decoding reference ready in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok((python, src))
}

/// `DOWNLOAD/pip-download-*/arctic-inference_*` or `arctic_inference-*`.
fn find_unpacked(download: &Path) -> Result<Option<PathBuf>> {
    for tmp in std::fs::read_dir(download)? {
        let tmp = tmp?.path();
        if !tmp.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&tmp)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.starts_with("arctic") && path.join("csrc").join("suffix_decoding").is_dir() {
                return Ok(Some(path));
            }
        }
    }
    Ok(None)
}

/// The last line of `out` starting with `prefix`, its numbers.
fn summary(out: &str, prefix: &str) -> Result<Vec<u64>> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with(prefix))
        .with_context(|| format!("no `{prefix}` summary in the output"))?;
    Ok(line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect())
}

fn python_script(python: &Path, script: &str) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(shell::root().join("xtask").join("python").join(script));
    cmd
}

pub fn run() -> Result<Counts> {
    let (python, src) = ensure()?;
    // suffix_proposals and suffix_cache_trace.
    shell::build()?;
    let examples = shell::out_dir().join("examples");
    let mut counts = Counts::default();

    let trie = python_script(&python, "suffix_oracle.py")
        .arg(src.join("arctic_inference").join("suffix_decoding"))
        .arg(examples.join("suffix_proposals"))
        .output()
        .context("running suffix_oracle.py")?;
    let text = String::from_utf8_lossy(&trie.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&trie.stderr));
    match summary(&text, "")?.as_slice() {
        [total, same, _] if trie.status.success() && total == same => counts.passed += 1,
        _ => counts.failed += 1,
    }

    let cache = python_script(&python, "suffix_cache_oracle.py")
        .arg(&src)
        .arg(examples.join("suffix_cache_trace"))
        .output()
        .context("running suffix_cache_oracle.py")?;
    let text = String::from_utf8_lossy(&cache.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&cache.stderr));
    match summary(&text, "suffix cache: ")?.as_slice() {
        [passed, failed] => {
            counts.passed += passed;
            counts.failed += failed;
        }
        other => bail!("cannot read the cache-level summary {other:?}"),
    }
    if !cache.status.success() && counts.failed == 0 {
        counts.failed += 1;
    }
    Ok(counts)
}
