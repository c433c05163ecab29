//! The cache outside `target/` where downloads and the mlx-c build live, keyed
//! by version, so a fresh clone on the same machine fetches and compiles nothing.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// `$MLX_SPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/mlx-spec`, else `~/.cache/mlx-spec`.
pub fn root() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("MLX_SPEC_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("mlx-spec"));
    }
    match env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("mlx-spec")),
        None => Err("mlx-sys: neither MLX_SPEC_CACHE_DIR nor HOME is set; \
                     set MLX_SPEC_CACHE_DIR to a writable directory"
            .to_owned()),
    }
}

/// Fills `dest` through `fill(tmp)` exactly once: the work happens in a private
/// temporary directory that is renamed into place, so concurrent builds never
/// see a half-written entry.
pub fn fill_once(
    dest: &Path,
    fill: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    if dest.exists() {
        return Ok(());
    }
    let parent = dest
        .parent()
        .ok_or_else(|| format!("{}: no parent", dest.display()))?;
    fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    if let Err(message) = fill(&tmp) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(message);
    }
    if fs::rename(&tmp, dest).is_err() {
        // Another build won the race: its entry is complete, ours is redundant.
        let _ = fs::remove_dir_all(&tmp);
        if !dest.exists() {
            return Err(format!("could not move {} into the cache", dest.display()));
        }
    }
    Ok(())
}

/// A short stable hash (FNV-1a) for cache keys.
pub fn key(parts: &[&str]) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for part in parts {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")[..12].to_owned()
}
