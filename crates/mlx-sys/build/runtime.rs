//! The runtime directory binaries load MLX from: a copy of `libmlx.so` whose
//! first dependency is our BLAS front (`gemm.rs`: row-invariant small
//! products) and whose RUNPATH puts OpenBLAS (when wired) ahead of the wheel's
//! reference BLAS, and links to it beside every binary of the profile, so
//! `cargo test`, `run`, `bench` and examples need no LD_LIBRARY_PATH.

use std::env;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::wheel::Mlx;
use crate::{cache, gemm, prereqs};

/// Which BLAS the runtime is wired to.
pub enum Blas {
    /// Debian's OpenBLAS (pthreads) in this directory.
    OpenBlas(PathBuf),
    /// Whatever the MLX installation itself links (the wheel's netlib BLAS).
    AsBuilt,
}

impl Blas {
    /// OpenBLAS unless `MLX_SPEC_BLAS=reference`; a missing OpenBLAS is an error.
    pub fn choose() -> Result<Blas, String> {
        match env::var("MLX_SPEC_BLAS").as_deref() {
            Ok("reference") => Ok(Blas::AsBuilt),
            Ok("openblas") | Err(_) => prereqs::openblas_dir()
                .map(Blas::OpenBlas)
                .ok_or_else(prereqs::openblas_missing),
            Ok(other) => Err(format!(
                "mlx-sys: MLX_SPEC_BLAS={other}: expected `openblas` or `reference`"
            )),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Blas::OpenBlas(dir) => format!("openblas:{}", dir.display()),
            Blas::AsBuilt => "reference".to_owned(),
        }
    }
}

/// Builds (once) the runtime directory for this MLX and BLAS; returns it and
/// the file name binaries record as their dependency (libmlx's SONAME).
pub fn prepare(mlx: &Mlx, blas: &Blas) -> Result<(PathBuf, String), String> {
    prereqs::patchelf()?;
    let source = mlx.lib_dir().join("libmlx.so");
    let soname = patchelf(&["--print-soname"], &source)?;
    let soname = if soname.is_empty() {
        "libmlx.so".to_owned()
    } else {
        soname
    };
    let key = cache::key(&[
        &mlx.prefix.to_string_lossy(),
        &blas.describe(),
        &gemm::source_text()?,
    ]);
    let dir = cache::root()?.join(format!("runtime-{key}"));
    cache::fill_once(&dir, |tmp| fill(tmp, &dir, mlx, blas, &source, &soname))?;
    Ok((dir, soname))
}

fn fill(
    tmp: &Path,
    final_dir: &Path,
    mlx: &Mlx,
    blas: &Blas,
    source: &Path,
    soname: &str,
) -> Result<(), String> {
    let copy = tmp.join(soname);
    fs::copy(source, &copy).map_err(|e| format!("copying {}: {e}", source.display()))?;
    if soname != "libmlx.so" {
        symlink(soname, tmp.join("libmlx.so")).map_err(|e| format!("linking libmlx.so: {e}"))?;
    }
    // The runtime directory itself first (OpenBLAS stand-ins), then the MLX
    // installation's own library directories.
    let mut runpath = vec![final_dir.to_path_buf(), mlx.lib_dir()];
    if let Some(bundled) = &mlx.bundled_libs {
        runpath.push(bundled.clone());
    }
    let runpath = runpath
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(":");
    patchelf(&["--set-rpath", &runpath], &copy)?;
    // The front comes first in libmlx's dependencies, so its `cblas_sgemm` is
    // the one libmlx binds; it forwards what it does not serve to the next.
    gemm::compile(tmp)?;
    patchelf(&["--add-needed", gemm::LIB_NAME], &copy)?;

    if let (Blas::OpenBlas(openblas), Some(bundled)) = (blas, &mlx.bundled_libs) {
        // libmlx.so asks for the wheel's renamed BLAS/LAPACK by file name;
        // stand-ins of those names make it load OpenBLAS instead.
        let entries =
            fs::read_dir(bundled).map_err(|e| format!("reading {}: {e}", bundled.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let target = if name.starts_with("libblas") {
                openblas.join("libblas.so.3")
            } else if name.starts_with("liblapack") {
                openblas.join("liblapack.so.3")
            } else {
                continue;
            };
            symlink(&target, tmp.join(&name)).map_err(|e| format!("linking {name}: {e}"))?;
        }
        let core = openblas.join("libopenblas.so.0");
        if core.exists() {
            symlink(&core, tmp.join("libopenblas.so.0"))
                .map_err(|e| format!("linking libopenblas.so.0: {e}"))?;
        }
    }
    Ok(())
}

/// Links the runtime library into `target/<profile>/`, `deps/` and
/// `examples/`, where the workspace's `-rpath $ORIGIN` finds it.
pub fn link_beside_binaries(runtime: &Path, soname: &str) -> Result<(), String> {
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    // OUT_DIR is <target>/<profile>/build/mlx-sys-<hash>/out.
    let profile = out_dir
        .ancestors()
        .nth(3)
        .ok_or("mlx-sys: unexpected OUT_DIR layout")?;
    for dir in [
        profile.to_path_buf(),
        profile.join("deps"),
        profile.join("examples"),
    ] {
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // The front beside binaries too: oracles preload it from there.
        for name in [soname, gemm::LIB_NAME] {
            let link = dir.join(name);
            let _ = fs::remove_file(&link);
            symlink(runtime.join(name), &link)
                .map_err(|e| format!("linking {}: {e}", link.display()))?;
        }
    }
    Ok(())
}

fn patchelf(args: &[&str], file: &Path) -> Result<String, String> {
    let output = Command::new("patchelf")
        .args(args)
        .arg(file)
        .output()
        .map_err(|e| format!("mlx-sys: running patchelf: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "mlx-sys: patchelf {} {} failed: {}",
            args.join(" "),
            file.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
