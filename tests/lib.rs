//! Cross-crate scenarios live in `tests/tests/`; this library only locates
//! the binaries the workspace built, for tests that run them like a user.

use std::path::PathBuf;

/// `target/<profile>/` of the running test binary (which sits in `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors().nth(2).map(PathBuf::from).unwrap_or_default()
}
