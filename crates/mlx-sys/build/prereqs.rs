//! Checks for the tools the Linux build needs, each failing with the Debian
//! package that provides it.

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn missing(what: &str, package: &str) -> String {
    format!(
        "mlx-sys: {what} was not found. Install it with `apt-get install {package}` \
         (or run `cargo xtask test`, which installs every prerequisite as root)."
    )
}

pub fn cmake() -> Result<(), String> {
    if runs("cmake", &["--version"]) {
        Ok(())
    } else {
        Err(missing("`cmake`", "cmake"))
    }
}

pub fn cxx_compiler() -> Result<(), String> {
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    if runs(&cxx, &["--version"]) {
        Ok(())
    } else {
        Err(missing(&format!("a C++ compiler (`{cxx}`)"), "g++"))
    }
}

pub fn python_pip() -> Result<(), String> {
    if runs("python3", &["-m", "pip", "--version"]) {
        Ok(())
    } else {
        Err(missing(
            "`python3 -m pip` (needed once to fetch the mlx-cpu wheel)",
            "python3-pip",
        ))
    }
}

pub fn patchelf() -> Result<(), String> {
    if runs("patchelf", &["--version"]) {
        Ok(())
    } else {
        Err(missing("`patchelf`", "patchelf"))
    }
}

/// bindgen loads libclang at build time.
pub fn libclang() -> Result<(), String> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = env::var_os("LIBCLANG_PATH") {
        dirs.push(PathBuf::from(dir));
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("llvm-") {
                dirs.push(entry.path().join("lib"));
            }
        }
    }
    dirs.push(PathBuf::from(format!("/usr/lib/{}", multiarch())));
    dirs.push(PathBuf::from("/usr/lib64"));
    let found = dirs.iter().any(|dir| {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("libclang"))
            })
            .unwrap_or(false)
    });
    if found {
        Ok(())
    } else {
        Err(missing("libclang (used by bindgen)", "libclang-dev"))
    }
}

/// Debian's multiarch triple for the target.
pub fn multiarch() -> String {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned());
    format!("{arch}-linux-gnu")
}

/// The OpenBLAS (pthreads) directory, holding `libblas.so.3` and `liblapack.so.3`.
pub fn openblas_dir() -> Option<PathBuf> {
    let candidates = [
        format!("/usr/lib/{}/openblas-pthread", multiarch()),
        "/usr/lib64/openblas-pthread".to_owned(),
    ];
    candidates
        .into_iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("libblas.so.3").exists() && dir.join("liblapack.so.3").exists())
}

pub fn openblas_missing() -> String {
    missing(
        "OpenBLAS (libblas.so.3 and liblapack.so.3 under openblas-pthread/); MLX on the \
         CPU is about 30x slower on its bundled reference BLAS. To build with the reference \
         BLAS anyway set MLX_SPEC_BLAS=reference",
        "libopenblas0-pthread",
    )
}
