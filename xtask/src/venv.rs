//! The project-managed Python environment at `<workspace>/.venv` holding the
//! oracles (mlx-lm on the same libmlx build as ours). Gates use it; the engine
//! never does.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::shell;

/// Exactly what the environment holds, installed in one `pip install` so pip
/// resolves them together. Changing this list rebuilds the environment.
pub const REQUIREMENTS: &[&str] = &[
    "mlx==0.32.2",
    "mlx-cpu==0.32.2",
    "mlx-lm==0.32.2",
    "jsonschema==4.25.1",
    "openai==3.57.0",
    "anthropic==2.16.0",
    "schemathesis==4.32.5",
];

/// Installed with `--no-deps` after the rest: packages whose declared
/// dependencies reach far beyond what the gates use (mlx-optiq, the Gemma-4
/// assistant's oracle, pulls a TUI, pygame, lm-format-enforcer...; its spec
/// decoding needs only mlx, mlx-lm and huggingface-hub, installed above;
/// gguf, the GGUF gate's reference, and llguidance, the structured gate's
/// grammar engine, need only numpy and transformers, which mlx-lm brings;
/// dflash, the DFlash gate's reference, declares torch and transformers but
/// its `model_mlx` needs only mlx, mlx-lm and huggingface-hub).
pub const NO_DEPS: &[&str] = &[
    "mlx-optiq==0.7.7",
    "gguf==0.19.0",
    "llguidance==1.9.1",
    "dflash==0.1.0",
];

/// Written inside the environment once the install succeeded; holds the
/// requirement list it was built from.
const MARKER: &str = "xtask-requirements.txt";

/// Like `MARKER`, for `NO_DEPS` (kept apart so adding one of those does not
/// rebuild the environment).
const NO_DEPS_MARKER: &str = "xtask-requirements-no-deps.txt";

/// Creates or refreshes the environment when needed; returns its `python`.
pub fn ensure() -> Result<PathBuf> {
    build_gemm_front()?;
    let dir = shell::root().join(".venv");
    let python = pinned(&dir, "Python environment", REQUIREMENTS)?;
    ensure_no_deps(&dir, &python, NO_DEPS)?;
    Ok(python)
}

/// The environment at `dir` holding exactly `requirements` (installed in one
/// `pip install`, so pip resolves them together): reused when its marker
/// file lists them, else created afresh. Returns its `python`.
pub fn pinned(dir: &std::path::Path, what: &str, requirements: &[&str]) -> Result<PathBuf> {
    let python = dir.join("bin").join("python");
    let wanted: String = requirements.iter().map(|r| format!("{r}\n")).collect();
    let marker = dir.join(MARKER);
    if python.exists() && std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str())
    {
        return Ok(python);
    }
    eprintln!(
        "creating the {what} {} ({})",
        dir.display(),
        requirements.join(" ")
    );
    let start = std::time::Instant::now();
    // `--clear` empties a stale or half-built environment instead of layering onto it.
    shell::run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(dir),
    )?;
    shell::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(requirements),
    )?;
    if !python.exists() {
        bail!(
            "{} is missing after creating the environment",
            python.display()
        );
    }
    std::fs::write(&marker, wanted)?;
    eprintln!("{what} ready in {:.1} s", start.elapsed().as_secs_f64());
    Ok(python)
}

/// Installs `packages` into the environment at `dir` without their
/// dependencies when it does not hold exactly them yet.
pub fn ensure_no_deps(
    dir: &std::path::Path,
    python: &std::path::Path,
    packages: &[&str],
) -> Result<()> {
    let marker = dir.join(NO_DEPS_MARKER);
    let wanted: String = packages.iter().map(|r| format!("{r}\n")).collect();
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    eprintln!(
        "installing into {} without dependencies: {}",
        dir.display(),
        packages.join(" ")
    );
    shell::run(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
            ])
            .args(packages),
    )?;
    std::fs::write(&marker, wanted)?;
    Ok(())
}

/// A command running the venv's `python`, on the kernels our engine runs on.
///
/// mlx in the venv loads the wheel's bundled reference BLAS, while our
/// build puts its row-invariant GEMM front (`crates/mlx-sys/gemm`) ahead of
/// OpenBLAS in the same libmlx: float32 matmuls would then round
/// differently. Preloading the front and then OpenBLAS gives the oracle the
/// same `cblas_sgemm` as ours (small products on the front's kernels, the rest
/// on OpenBLAS), so equal op sequences give equal bits (the parity gate's
/// logit difference is exactly 0). `ensure` builds the front first.
pub fn python_command(python: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(python);
    let reference = std::env::var("MLX_SPEC_BLAS").is_ok_and(|v| v == "reference");
    let mut preload: Vec<PathBuf> = gemm_front().into_iter().collect();
    if let Some(blas) = openblas_blas().filter(|_| !reference) {
        preload.push(blas);
    }
    if !preload.is_empty() {
        cmd.env(
            "LD_PRELOAD",
            preload
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(":"),
        );
    }
    cmd
}

/// Our GEMM front as the build links it beside the binaries.
pub fn gemm_front() -> Option<PathBuf> {
    let path = shell::out_dir().join(GEMM_FRONT);
    path.exists().then_some(path)
}

/// The front's file name (`crates/mlx-sys/build/gemm.rs`).
const GEMM_FRONT: &str = "libmlx_spec_gemm.so";

/// Builds mlx-sys in this process's profile, which links the front beside
/// the binaries, and checks that it is there.
fn build_gemm_front() -> Result<()> {
    // The whole build, not `-p mlx-sys`: that one resolves bindgen's
    // dependencies with other features and builds mlx-sys a second time.
    shell::build()?;
    if gemm_front().is_none() {
        bail!(
            "building mlx-sys left no {}",
            shell::out_dir().join(GEMM_FRONT).display()
        );
    }
    Ok(())
}

/// Debian's OpenBLAS (pthreads) BLAS library, as `crates/mlx-sys` wires it.
pub fn openblas_blas() -> Option<std::path::PathBuf> {
    let arch = std::env::consts::ARCH;
    [
        format!("/usr/lib/{arch}-linux-gnu/openblas-pthread/libblas.so.3"),
        "/usr/lib64/openblas-pthread/libblas.so.3".to_owned(),
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.exists())
}
