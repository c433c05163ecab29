//! The prebuilt MLX to compile against: a prefix named by `MLX_DIR`, or the
//! official `mlx-cpu` wheel from PyPI, fetched once into the cache.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cache, prereqs, MLX_VERSION};

/// A prebuilt MLX installation.
pub struct Mlx {
    /// Holds `lib/`, `include/` and `share/cmake/MLX/`.
    pub prefix: PathBuf,
    /// The wheel's bundled reference BLAS/LAPACK and their runtime libraries
    /// (`mlx_cpu.libs/`); `None` for a user prefix.
    pub bundled_libs: Option<PathBuf>,
}

impl Mlx {
    pub fn lib_dir(&self) -> PathBuf {
        self.prefix.join("lib")
    }
    pub fn include_dir(&self) -> PathBuf {
        self.prefix.join("include")
    }
    pub fn cmake_dir(&self) -> PathBuf {
        self.prefix.join("share").join("cmake").join("MLX")
    }
}

pub fn locate() -> Result<Mlx, String> {
    let mlx = match env::var_os("MLX_DIR") {
        Some(dir) => user_prefix(Path::new(&dir))?,
        None => cached_wheel()?,
    };
    for needed in [
        mlx.lib_dir().join("libmlx.so"),
        mlx.include_dir().join("mlx").join("mlx.h"),
        mlx.cmake_dir().join("MLXConfig.cmake"),
    ] {
        if !needed.exists() {
            return Err(format!(
                "mlx-sys: the MLX installation at {} lacks {}",
                mlx.prefix.display(),
                needed.display()
            ));
        }
    }
    Ok(mlx)
}

/// `MLX_DIR` may name the prefix or its `share/cmake/MLX` directory (as CMake's
/// own `MLX_DIR` does).
fn user_prefix(dir: &Path) -> Result<Mlx, String> {
    let dir =
        fs::canonicalize(dir).map_err(|e| format!("mlx-sys: MLX_DIR={}: {e}", dir.display()))?;
    let prefix = if dir.join("MLXConfig.cmake").exists() {
        dir.ancestors().nth(3).map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    };
    let bundled = prefix
        .parent()
        .map(|p| p.join("mlx_cpu.libs"))
        .filter(|p| p.is_dir());
    Ok(Mlx {
        prefix,
        bundled_libs: bundled,
    })
}

fn cached_wheel() -> Result<Mlx, String> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned());
    let dir = cache::root()?.join(format!("mlx-cpu-{MLX_VERSION}-{arch}"));
    cache::fill_once(&dir, fetch_wheel)?;
    Ok(Mlx {
        prefix: dir.join("mlx"),
        bundled_libs: Some(dir.join("mlx_cpu.libs")),
    })
}

/// `pip download` of `mlx-cpu==0.32.2` for this platform, unpacked in `dest`.
fn fetch_wheel(dest: &Path) -> Result<(), String> {
    prereqs::python_pip()?;
    println!(
        "cargo:warning=mlx-sys: fetching mlx-cpu=={MLX_VERSION} from PyPI (once; cached in {})",
        dest.parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    let download = dest.join("download");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
        ])
        .arg(&download)
        .arg(format!("mlx-cpu=={MLX_VERSION}"))
        .status()
        .map_err(|e| format!("mlx-sys: running pip: {e}"))?;
    if !status.success() {
        return Err(format!(
            "mlx-sys: `pip download mlx-cpu=={MLX_VERSION}` failed (is PyPI reachable?). \
             Alternatively point MLX_DIR at an MLX {MLX_VERSION} installation prefix."
        ));
    }
    let wheel = fs::read_dir(&download)
        .map_err(|e| format!("reading {}: {e}", download.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("mlx-sys: pip downloaded no mlx-cpu wheel")?;
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(dest)
        .status()
        .map_err(|e| format!("mlx-sys: unpacking {}: {e}", wheel.display()))?;
    if !status.success() {
        return Err(format!("mlx-sys: could not unpack {}", wheel.display()));
    }
    fs::remove_dir_all(&download).map_err(|e| format!("removing {}: {e}", download.display()))
}
