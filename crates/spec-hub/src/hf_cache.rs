//! Models already in the local Hugging Face cache, named by repo id
//! (`org/name`, as `mlx_lm.generate --model` takes them): the snapshot
//! `huggingface_hub` left for the `main` ref. mlx-spec reads that cache and
//! never writes to it or downloads into it (no model hub is reachable from
//! where it is built; a user fetches with `hf download org/name`).
//!
//! Layout (`huggingface_hub`'s): `HUB/models--org--name/refs/main` holds a
//! commit hash and `HUB/models--org--name/snapshots/<hash>/` the files, as
//! links into `blobs/`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::HubError;

/// The hub cache: `$HF_HUB_CACHE` (or the older `$HUGGINGFACE_HUB_CACHE`),
/// else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
/// `$HOME/.cache/huggingface/hub`; `None` when none is set.
pub fn hub_cache() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name);
    hub_cache_from(
        var("HF_HUB_CACHE")
            .filter(|v| !v.is_empty())
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .as_deref(),
        var("HF_HOME").as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

/// The rule behind [`hub_cache`], given those variables' values (an empty
/// value counts as unset).
pub fn hub_cache_from(
    hub_cache: Option<&OsStr>,
    hf_home: Option<&OsStr>,
    xdg_cache_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    let set = |value: Option<&OsStr>| value.filter(|v| !v.is_empty()).map(PathBuf::from);
    set(hub_cache)
        .or_else(|| set(hf_home).map(|h| h.join("hub")))
        .or_else(|| set(xdg_cache_home).map(|x| x.join("huggingface").join("hub")))
        .or_else(|| set(home).map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// Whether `name` reads as a Hugging Face repo id: `org/name`, each part
/// of letters, digits, `-`, `_` and `.`, neither part `.` or `..`.
pub fn is_repo_id(name: &str) -> bool {
    let mut parts = name.split('/');
    let (Some(org), Some(repo), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    [org, repo].iter().all(|p| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    })
}

/// The snapshot of `repo_id` in the hub cache `cache`: the one `refs/main`
/// names, or the only one there is.
pub fn snapshot_in(cache: &Path, repo_id: &str) -> Result<PathBuf, HubError> {
    let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
    let not_cached = |why: String| HubError::NotInHfCache {
        repo_id: repo_id.to_owned(),
        cache: cache.to_path_buf(),
        why,
    };
    if !repo.is_dir() {
        return Err(not_cached(format!("no {}", repo.display())));
    }
    let snapshots = repo.join("snapshots");
    let refs_main = repo.join("refs").join("main");
    let snapshot = match std::fs::read_to_string(&refs_main) {
        Ok(hash) => {
            let hash = hash.trim();
            if !is_commit_hash(hash) {
                return Err(not_cached(format!(
                    "{} does not hold a commit hash",
                    refs_main.display()
                )));
            }
            snapshots.join(hash)
        }
        Err(_) => {
            let found: Vec<PathBuf> = std::fs::read_dir(&snapshots)
                .map_err(HubError::io("reading", &snapshots))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            match found.as_slice() {
                [one] => one.clone(),
                [] => {
                    return Err(not_cached(format!(
                        "no snapshot in {}",
                        snapshots.display()
                    )))
                }
                _ => {
                    return Err(not_cached(format!(
                    "{} snapshots and no refs/main to choose one; pass the snapshot's directory",
                    found.len()
                )))
                }
            }
        }
    };
    if !snapshot.is_dir() {
        return Err(not_cached(format!("no {}", snapshot.display())));
    }
    Ok(snapshot)
}

/// A git object name: 40 (SHA-1) or 64 (SHA-256) hex digits.
fn is_commit_hash(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn the_cache_follows_huggingface_hubs_variables() {
        fn s(v: &str) -> Option<&OsStr> {
            Some(OsStr::new(v))
        }
        assert_eq!(
            hub_cache_from(s("/hc"), s("/hh"), s("/x"), s("/h")),
            Some(PathBuf::from("/hc"))
        );
        assert_eq!(
            hub_cache_from(s(""), s("/hh"), s("/x"), s("/h")),
            Some(PathBuf::from("/hh/hub"))
        );
        assert_eq!(
            hub_cache_from(None, None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/huggingface/hub"))
        );
        assert_eq!(
            hub_cache_from(None, None, None, s("/h")),
            Some(PathBuf::from("/h/.cache/huggingface/hub"))
        );
        assert_eq!(hub_cache_from(None, None, None, None), None);
    }

    #[test]
    fn repo_ids_are_told_from_paths() {
        for id in ["mlx-community/Qwen3-0.6B-4bit", "org/model.v2", "a_b/c"] {
            assert!(is_repo_id(id), "{id}");
        }
        for path in [
            "model",
            "./model",
            "/abs/model",
            "a/b/c",
            "../x",
            "a/",
            "a/..",
            "a b/c",
        ] {
            assert!(!is_repo_id(path), "{path}");
        }
    }

    fn repo(cache: &Path) -> PathBuf {
        let repo = cache.join("models--acme--tiny");
        std::fs::create_dir_all(repo.join("snapshots").join(HASH)).expect("mkdir");
        repo
    }

    #[test]
    fn refs_main_names_the_snapshot() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = repo(tmp.path());
        std::fs::create_dir_all(repo.join("snapshots").join("f".repeat(40))).expect("mkdir");
        std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
        std::fs::write(repo.join("refs").join("main"), format!("{HASH}\n")).expect("write");
        let got = snapshot_in(tmp.path(), "acme/tiny").expect("cached");
        assert_eq!(got, repo.join("snapshots").join(HASH));
    }

    #[test]
    fn without_refs_the_only_snapshot() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = repo(tmp.path());
        let got = snapshot_in(tmp.path(), "acme/tiny").expect("cached");
        assert_eq!(got, repo.join("snapshots").join(HASH));
        std::fs::create_dir_all(repo.join("snapshots").join("f".repeat(40))).expect("mkdir");
        let err = snapshot_in(tmp.path(), "acme/tiny").expect_err("ambiguous");
        assert!(err.to_string().contains("2 snapshots"), "{err}");
    }

    #[test]
    fn what_is_missing_is_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = snapshot_in(tmp.path(), "acme/absent").expect_err("absent");
        let text = err.to_string();
        assert!(
            text.contains("acme/absent") && text.contains("models--acme--absent"),
            "{text}"
        );
        assert!(text.contains("hf download acme/absent"), "{text}");
        let repo = repo(tmp.path());
        std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
        std::fs::write(repo.join("refs").join("main"), "not a hash").expect("write");
        let err = snapshot_in(tmp.path(), "acme/tiny").expect_err("bad ref");
        assert!(err.to_string().contains("commit hash"), "{err}");
        std::fs::write(repo.join("refs").join("main"), "e".repeat(40)).expect("write");
        let err = snapshot_in(tmp.path(), "acme/tiny").expect_err("missing snapshot");
        assert!(err.to_string().contains(&"e".repeat(40)), "{err}");
    }
}
