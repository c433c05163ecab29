//! Where fetched models live, and how a cache entry is filled atomically.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::HubError;

/// The cache root: `$MLX_SPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/mlx-spec`, else
/// `$HOME/.cache/mlx-spec` (the same directory the `mlx-sys` build uses).
pub fn cache_root() -> Result<PathBuf, HubError> {
    cache_root_from(
        std::env::var_os("MLX_SPEC_CACHE_DIR").as_deref(),
        std::env::var_os("XDG_CACHE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
}

/// The rule behind [`cache_root`], given the values of `MLX_SPEC_CACHE_DIR`,
/// `XDG_CACHE_HOME` and `HOME`. An empty value counts as unset, as the XDG base
/// directory specification asks for `XDG_CACHE_HOME`.
pub fn cache_root_from(
    mlx_spec_cache_dir: Option<&OsStr>,
    xdg_cache_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Result<PathBuf, HubError> {
    let set = |value: Option<&OsStr>| value.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(mlx_spec_cache_dir) {
        return Ok(dir);
    }
    if let Some(dir) = set(xdg_cache_home) {
        return Ok(dir.join("mlx-spec"));
    }
    match set(home) {
        Some(home) => Ok(home.join(".cache").join("mlx-spec")),
        None => Err(HubError::NoCacheDir),
    }
}

/// Creates the directory `dest` by running `fill` on a private temporary
/// directory beside it and renaming that into place, so no reader ever sees a
/// half-written entry. If another process wins the race its entry is kept.
pub(crate) fn fill_dir(
    dest: &Path,
    fill: impl FnOnce(&Path) -> Result<(), HubError>,
) -> Result<(), HubError> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(HubError::io("creating", parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp-"))
        .tempdir_in(parent)
        .map_err(HubError::io("creating a temporary directory in", parent))?;
    fill(tmp.path())?;
    let tmp = tmp.keep();
    if let Err(source) = fs::rename(&tmp, dest) {
        let _ = fs::remove_dir_all(&tmp);
        if !dest.is_dir() {
            return Err(HubError::Io {
                action: "moving into place",
                path: dest.to_owned(),
                source,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cache: Option<&str>, xdg: Option<&str>, home: Option<&str>, expected: Option<&str>) {
        let actual = cache_root_from(
            cache.map(OsStr::new),
            xdg.map(OsStr::new),
            home.map(OsStr::new),
        );
        match (actual, expected) {
            (Ok(actual), Some(expected)) => assert_eq!(actual, Path::new(expected)),
            (Err(HubError::NoCacheDir), None) => {}
            (actual, expected) => panic!("got {actual:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn explicit_cache_dir_wins() {
        check(Some("/c"), Some("/x"), Some("/h"), Some("/c"));
    }

    #[test]
    fn xdg_cache_home_before_home() {
        check(None, Some("/x"), Some("/h"), Some("/x/mlx-spec"));
    }

    #[test]
    fn home_is_the_fallback() {
        check(None, None, Some("/h"), Some("/h/.cache/mlx-spec"));
    }

    #[test]
    fn empty_values_count_as_unset() {
        check(Some(""), Some(""), Some("/h"), Some("/h/.cache/mlx-spec"));
    }

    #[test]
    fn nothing_set_is_an_error() {
        check(None, None, None, None);
        check(Some(""), None, Some(""), None);
    }

    #[test]
    fn fill_dir_publishes_only_complete_entries() {
        let root = tempfile::tempdir().expect("tempdir");
        let dest = root.path().join("entry");
        let failed = fill_dir(&dest, |tmp| {
            fs::write(tmp.join("half"), b"x").map_err(HubError::io("writing", tmp))?;
            Err(HubError::NoCacheDir)
        });
        assert!(failed.is_err());
        assert!(!dest.exists());
        assert_eq!(
            fs::read_dir(root.path()).expect("read_dir").count(),
            0,
            "temporary dir left behind"
        );

        fill_dir(&dest, |tmp| {
            fs::write(tmp.join("file"), b"ok").map_err(HubError::io("writing", tmp))
        })
        .expect("fill");
        assert_eq!(fs::read(dest.join("file")).expect("read"), b"ok");
        // A second filler loses the race quietly and leaves the first entry.
        fill_dir(&dest, |tmp| {
            fs::write(tmp.join("other"), b"no").map_err(HubError::io("writing", tmp))
        })
        .expect("fill again");
        assert!(!dest.join("other").exists());
        assert_eq!(fs::read_dir(root.path()).expect("read_dir").count(), 1);
    }
}
