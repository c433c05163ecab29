//! Running commands from the workspace root, echoing them first.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The release build the gates run their binaries and examples from, as
/// `cargo xtask test`'s "build (release, binaries and examples)" runs it.
/// Gates build with exactly these arguments and run what they need from
/// `target/release/`: `cargo build -p X` resolves features for X alone
/// (`mlx-sys` without the default features `--workspace` selects it with,
/// `serde_json` without `raw_value`...),
/// which made the gates rebuild most of the workspace a second and third time.
pub const RELEASE_BUILD: &[&str] = &[
    "build",
    "--release",
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

/// The debug build of every example (`cargo xtask test`'s "build (debug,
/// examples)"), which gates running debug examples reuse the same way.
pub const DEBUG_EXAMPLES_BUILD: &[&str] =
    &["build", "--workspace", "--exclude", "xtask", "--examples"];

/// Runs [`RELEASE_BUILD`] (nothing to do once it ran).
pub fn release_build() -> Result<()> {
    run(cargo().args(RELEASE_BUILD).arg("-q"))
}

/// Runs [`DEBUG_EXAMPLES_BUILD`] (nothing to do once it ran).
pub fn debug_examples_build() -> Result<()> {
    run(cargo().args(DEBUG_EXAMPLES_BUILD).arg("-q"))
}

/// `target/release/NAME` (a binary of [`RELEASE_BUILD`]), run from the root.
pub fn release_bin(name: &str) -> Command {
    let mut cmd = Command::new(root().join("target").join("release").join(name));
    cmd.current_dir(root());
    cmd
}

/// `target/release/examples/NAME` (an example of [`RELEASE_BUILD`]), run
/// from the root.
pub fn release_example(name: &str) -> Command {
    let mut cmd = Command::new(
        root()
            .join("target")
            .join("release")
            .join("examples")
            .join(name),
    );
    cmd.current_dir(root());
    cmd
}

/// `target/debug/examples/NAME` (an example of [`DEBUG_EXAMPLES_BUILD`]),
/// run from the root.
pub fn debug_example(name: &str) -> Command {
    let mut cmd = Command::new(
        root()
            .join("target")
            .join("debug")
            .join("examples")
            .join(name),
    );
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
    cmd
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
