//! Running the run binaries (the examples the gates and benches drive)
//! through `run-protocol`: the request goes to `STEM.request.json`, the
//! binary's one argument; its report, read from standard output, is saved
//! to `STEM.json` and parsed with the request's report type.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use run_protocol::Request;

use crate::shell;

/// `STEM.request.json`.
pub fn request_file(stem: &Path) -> PathBuf {
    with_suffix(stem, ".request.json")
}

/// `STEM.json`.
pub fn report_file(stem: &Path) -> PathBuf {
    with_suffix(stem, ".json")
}

/// `path` with `suffix` appended to its last component.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Runs `R::BINARY` from this process's build (see [`shell::profile`]).
pub fn example<R: Request>(request: &R, stem: &Path, env: &[(&str, &str)]) -> Result<R::Report> {
    run(shell::example(R::BINARY), request, stem, env)
}

fn run<R: Request>(
    mut cmd: Command,
    request: &R,
    stem: &Path,
    env: &[(&str, &str)],
) -> Result<R::Report> {
    let (request_path, report_path) = (request_file(stem), report_file(stem));
    if let Some(dir) = stem.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&request_path, run_protocol::request_json(request))
        .with_context(|| format!("writing {}", request_path.display()))?;
    let _ = std::fs::remove_file(&report_path);
    cmd.arg(&request_path)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let shown = shell::render(&cmd);
    eprintln!("$ {shown}");
    let out = cmd
        .output()
        .with_context(|| format!("starting `{shown}`"))?;
    std::fs::write(&report_path, &out.stdout)
        .with_context(|| format!("writing {}", report_path.display()))?;
    if !out.status.success() {
        bail!("`{shown}` failed ({})", out.status);
    }
    let text = String::from_utf8(out.stdout)
        .with_context(|| format!("{}: the report is not UTF-8", R::BINARY))?;
    Ok(run_protocol::parse_report::<R>(
        &report_path.display().to_string(),
        &text,
    )?)
}

/// Reads a report `R`'s binary, or an oracle writing the same type, saved
/// at `path`.
pub fn read_report<R: Request>(path: &Path) -> Result<R::Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(run_protocol::parse_report::<R>(
        &path.display().to_string(),
        &text,
    )?)
}

#[cfg(test)]
mod tests {
    use run_protocol::Request;

    /// Every request type names an example some crate has (the list is
    /// every `impl Request` of `run-protocol`).
    #[test]
    fn every_protocol_binary_is_an_example() {
        use run_protocol::{assistant, dflash, dspark, eagle3, gguf, greedy, invariance, mtp};
        use run_protocol::{prompt_cache, spec, structured, suffix, timing};
        let binaries = [
            spec::SpecRequest::BINARY,
            greedy::ParityRequest::BINARY,
            invariance::InvarianceRequest::BINARY,
            prompt_cache::PromptCacheRequest::BINARY,
            mtp::MtpRequest::BINARY,
            mtp::QwenMtpRequest::BINARY,
            dspark::DsparkRequest::BINARY,
            dflash::DflashRequest::BINARY,
            eagle3::Eagle3Request::BINARY,
            structured::StructuredRequest::BINARY,
            assistant::StepRequest::BINARY,
            assistant::RoundRequest::BINARY,
            gguf::GgufRequest::BINARY,
            timing::BatchTimeRequest::BINARY,
            timing::WindowTimeRequest::BINARY,
            suffix::TrieRequest::BINARY,
            suffix::CacheRequest::BINARY,
        ];
        // The engine crates' examples and the cross-crate ones (`tests/`).
        let root = crate::shell::root();
        let examples: Vec<String> = std::fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
            .map(|c| c.path())
            .chain([root.join("tests")])
            .filter_map(|c| std::fs::read_dir(c.join("examples")).ok())
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".rs")
                    .map(str::to_owned)
            })
            .collect();
        for binary in binaries {
            assert!(
                examples.iter().any(|e| e == binary),
                "no example {binary}.rs"
            );
        }
    }
}
