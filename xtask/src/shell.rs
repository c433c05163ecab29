//! Running commands from the workspace root, echoing them first.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Which build `xtask` runs its binaries and examples from: the gates use
/// the debug build (MLX does the work and dependencies are optimised in
/// `dev`, so a gate runs as fast from it: `lossless` 5:32 debug against
/// 5:50 to 6:19 release here), which `cargo xtask test` builds anyway for
/// its tests, so CI builds the workspace once, not twice. Benchmarks time
/// our own code too and use the release build ([`use_release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Debug,
    Release,
}

static PROFILE: OnceLock<Profile> = OnceLock::new();

/// Makes every later build and run of this process use the release build
/// (`cargo xtask bench`). Call it before the first [`profile`].
pub fn use_release() {
    let _ = PROFILE.set(Profile::Release);
}

/// The build this process runs from (debug unless [`use_release`] ran).
pub fn profile() -> Profile {
    *PROFILE.get_or_init(|| Profile::Debug)
}

/// The build of every binary and example, as `cargo xtask test`'s "build
/// (binaries and examples)" runs it. Gates and benches build with exactly
/// these arguments (the release build adds `--release`) and run what they
/// need from `target/<profile>/`: `cargo build -p X` resolves features for
/// X alone (`mlx-sys` without the default features `--workspace` selects it
/// with, `serde_json` without `raw_value`...), which made them rebuild most
/// of the workspace a second and third time.
pub const BUILD: &[&str] = &[
    "build",
    "--workspace",
    "--exclude",
    "xtask",
    "--bins",
    "--examples",
];

/// The packages of every debug build and test run: the workspace without
/// `xtask`. One selection, so one resolution of features: `xtask`'s own
/// dependencies (ureq's proc macros) turn on features of `syn` that the
/// engine's do not, and a selection with `xtask` in it (`cargo test
/// --workspace`) and one without (`cargo test --workspace --doc`, which
/// leaves out packages without a library) built every proc macro and every
/// crate above them twice. `xtask`'s tests run as `cargo test -p xtask`,
/// the selection `cargo xtask` itself builds with.
pub const DEBUG_SELECTION: &[&str] = &["--workspace", "--exclude", "xtask"];

/// [`BUILD`] in this process's [`profile`], as cargo arguments.
pub fn build_args() -> Vec<&'static str> {
    let mut args = BUILD.to_vec();
    if profile() == Profile::Release {
        args.insert(1, "--release");
    }
    args
}

/// Runs [`BUILD`] in this process's [`profile`] (nothing to do once it ran).
pub fn build() -> Result<()> {
    run(cargo().args(build_args()).arg("-q"))
}

/// `target/<profile>/`, where [`build`] leaves binaries and the runtime
/// libraries beside them.
pub fn out_dir() -> PathBuf {
    let dir = match profile() {
        Profile::Debug => "debug",
        Profile::Release => "release",
    };
    root().join("target").join(dir)
}

/// `target/<profile>/NAME` (a binary of [`BUILD`]), run from the root.
pub fn bin(name: &str) -> Command {
    let mut cmd = Command::new(out_dir().join(name));
    cmd.current_dir(root());
    cmd
}

/// `target/<profile>/examples/NAME` (an example of [`BUILD`]), run from the
/// root.
pub fn example(name: &str) -> Command {
    let mut cmd = Command::new(out_dir().join("examples").join(name));
    cmd.current_dir(root());
    cmd
}

/// `cargo` as invoked by the alias, so the same toolchain builds everything.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    cmd.current_dir(root());
    // A fresh clone (CI) builds everything once: incremental compilation
    // only adds its bookkeeping there. Set `CARGO_INCREMENTAL=1` to keep it.
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    if profile() == Profile::Debug {
        if let Some(driver) = clippy_driver() {
            cmd.env("RUSTC_WORKSPACE_WRAPPER", driver)
                .env("CLIPPY_ARGS", CLIPPY_ARGS);
        }
    }
    cmd
}

/// Clippy's lints ride on the debug build: every debug build `xtask` runs
/// compiles the workspace's own crates through `clippy-driver` (what `cargo
/// clippy` does for `cargo check`), so `cargo xtask test` lints each crate
/// as it builds it instead of type-checking the whole dependency tree a
/// second time (3 to 5 minutes of CI). Cargo keeps these artifacts apart
/// from a plain `cargo build`'s (the wrapper is part of their hash).
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

/// `clippy-driver` beside the `cargo` running us (the clippy component of
/// the same toolchain), if it is installed.
pub fn clippy_driver() -> Option<PathBuf> {
    let cargo = PathBuf::from(std::env::var_os("CARGO")?);
    let driver = cargo.with_file_name("clippy-driver");
    driver.exists().then_some(driver)
}

/// Runs `cmd`, failing with its rendering when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = render(cmd);
    eprintln!("$ {shown}");
    let status = cmd
        .status()
        .with_context(|| format!("starting `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// `cmd` as a shell line.
pub fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::{build_args, cargo, clippy_driver, profile, Profile, CLIPPY_ARGS};

    /// CI's lints are this wrapper: without it `cargo xtask test` would pass
    /// code clippy refuses, silently.
    #[test]
    fn debug_builds_compile_through_clippy_denying_warnings() {
        assert_eq!(profile(), Profile::Debug);
        assert!(!build_args().contains(&"--release"));
        let driver =
            clippy_driver().expect("clippy-driver beside cargo (`rustup component add clippy`)");
        let cmd = cargo();
        let env = |key: &str| {
            cmd.get_envs()
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| v)
                .map(|v| v.to_string_lossy().into_owned())
        };
        assert_eq!(
            env("RUSTC_WORKSPACE_WRAPPER").as_deref(),
            Some(driver.to_string_lossy().as_ref())
        );
        let args = env("CLIPPY_ARGS").expect("CLIPPY_ARGS");
        assert_eq!(args, CLIPPY_ARGS);
        let words: Vec<&str> = args
            .split("__CLIPPY_HACKERY__")
            .filter(|w| !w.is_empty())
            .collect();
        assert_eq!(words, ["-D", "warnings"]);
    }
}
