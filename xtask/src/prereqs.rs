//! System prerequisites of the build (see `crates/mlx-sys`): checked before
//! anything compiles, installed with apt-get when we are root on Debian.

use std::process::{Command, Stdio};

use anyhow::{bail, Result};

use crate::shell;

/// Debian packages the MLX build needs, each with how to tell it is present.
const PACKAGES: &[(&str, Check)] = &[
    ("cmake", Check::Command("cmake")),
    ("g++", Check::Command("c++")),
    ("clang", Check::Command("clang")),
    ("libclang-dev", Check::Package),
    ("patchelf", Check::Command("patchelf")),
    ("libopenblas0-pthread", Check::Package),
    ("python3-pip", Check::PythonModule("pip")),
    ("python3-venv", Check::PythonModule("venv")),
    // Python's headers: gate `suffix` builds the reference's extension.
    ("python3-dev", Check::Package),
    // The GEMM kernels of the other CPU architecture, built and run under
    // QEMU by `crates/mlx-sys/tests/other_arch.rs`.
    ("qemu-user", Check::Command("qemu-aarch64")),
    #[cfg(not(target_arch = "aarch64"))]
    (
        "gcc-aarch64-linux-gnu",
        Check::Command("aarch64-linux-gnu-gcc"),
    ),
    #[cfg(not(target_arch = "aarch64"))]
    ("libc6-dev-arm64-cross", Check::Package),
    #[cfg(target_arch = "aarch64")]
    (
        "gcc-x86-64-linux-gnu",
        Check::Command("x86_64-linux-gnu-gcc"),
    ),
    #[cfg(target_arch = "aarch64")]
    ("libc6-dev-amd64-cross", Check::Package),
];

enum Check {
    Command(&'static str),
    Package,
    PythonModule(&'static str),
}

fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn present(package: &str, check: &Check) -> bool {
    match check {
        Check::Command(program) => quiet(Command::new(program).arg("--version")),
        Check::Package => {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", package])
                .output();
            matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        }
        Check::PythonModule(module) => {
            quiet(Command::new("python3").args(["-m", module, "--help"]))
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Installs whatever is missing (as root, through apt-get) or fails naming it.
pub fn ensure() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(p, c)| !present(p, c))
        .map(|(p, _)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let have_apt = quiet(Command::new("apt-get").arg("--version"));
    if !(have_apt && is_root()) {
        bail!(
            "missing prerequisites: {}\ninstall them with: sudo apt-get install {}",
            missing.join(", "),
            missing.join(" ")
        );
    }
    eprintln!("installing prerequisites: {}", missing.join(" "));
    shell::run(Command::new("apt-get").args(["update", "-qq"]))?;
    shell::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    let still: Vec<&str> = PACKAGES
        .iter()
        .filter(|(p, c)| !present(p, c))
        .map(|(p, _)| *p)
        .collect();
    if !still.is_empty() {
        bail!(
            "apt-get finished but these are still missing: {}",
            still.join(", ")
        );
    }
    Ok(())
}

/// The toolchain components `cargo xtask test` lints with: added through
/// rustup when it manages the toolchain, else named in the error.
pub fn ensure_lint_tools() -> Result<()> {
    // Each component with the cargo subcommand it provides.
    let missing = || -> Vec<&'static str> {
        [("rustfmt", "fmt"), ("clippy", "clippy")]
            .into_iter()
            .filter(|(_, sub)| !quiet(shell::cargo().args([*sub, "--version"])))
            .map(|(component, _)| component)
            .collect()
    };
    let absent = missing();
    if absent.is_empty() {
        return Ok(());
    }
    if quiet(Command::new("rustup").arg("--version")) {
        eprintln!("adding toolchain components: {}", absent.join(" "));
        shell::run(
            Command::new("rustup")
                .args(["component", "add"])
                .args(&absent),
        )?;
    }
    let still = missing();
    if !still.is_empty() {
        bail!(
            "missing toolchain components: {} (install them with `rustup component add {}` \
             or your distribution's packages)",
            still.join(", "),
            still.join(" ")
        );
    }
    Ok(())
}
