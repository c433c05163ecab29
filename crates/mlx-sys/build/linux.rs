//! The Linux build: prebuilt MLX, mlx-c compiled once into the cache, a small
//! C++ shim for what mlx-c lacks off Apple platforms, bindings, runtime wiring.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use crate::runtime::{self, Blas};
use crate::wheel::{self, Mlx};
use crate::{bindings, cache, prereqs, sources, MLX_C_VERSION};

pub fn build() -> Result<(), String> {
    prereqs::cmake()?;
    prereqs::cxx_compiler()?;
    prereqs::libclang()?;
    let blas = Blas::choose()?;
    let mlx = wheel::locate()?;
    let mlx_c = sources::mlx_c_root()?;
    let shim_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?).join("shim");

    let mlxc_lib = build_mlx_c(&mlx_c, &mlx, &shim_dir)?;
    compile_shim(&mlx_c, &mlx, &shim_dir)?;
    bindings::generate(&mlx_c, &shim_dir.join("bindgen_prelude.h"))?;
    let (runtime_dir, soname) = runtime::prepare(&mlx, &blas)?;
    runtime::link_beside_binaries(&runtime_dir, &soname)?;

    println!("cargo:rustc-link-search=native={}", mlxc_lib.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", runtime_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!(
        "cargo:rerun-if-changed={}",
        runtime_dir.join(&soname).display()
    );

    let reference = match (&blas, &mlx.bundled_libs) {
        (Blas::OpenBlas(_), Some(_)) => mlx.lib_dir().to_string_lossy().into_owned(),
        _ => String::new(),
    };
    println!("cargo:rustc-env=MLX_SYS_BLAS_WIRED={}", blas.describe());
    println!(
        "cargo:rustc-env=MLX_SYS_MLX_PREFIX={}",
        mlx.prefix.display()
    );
    println!(
        "cargo:rustc-env=MLX_SYS_RUNTIME_DIR={}",
        runtime_dir.display()
    );
    println!("cargo:rustc-env=MLX_SYS_REFERENCE_LIB_DIR={reference}");
    println!("cargo::metadata=include={}", mlx.include_dir().display());
    println!("cargo::metadata=runtime={}", runtime_dir.display());
    let said = match &blas {
        Blas::OpenBlas(dir) => format!("OpenBLAS ({})", dir.display()),
        Blas::AsBuilt => "the BLAS MLX was built with (MLX_SPEC_BLAS=reference)".to_owned(),
    };
    println!(
        "cargo:warning=mlx-sys: MLX from {} wired to {said}",
        mlx.prefix.display()
    );
    Ok(())
}

/// Compiles mlx-c as a static library once per MLX installation and compiler;
/// returns the directory holding `libmlxc.a`.
fn build_mlx_c(mlx_c: &Path, mlx: &Mlx, shim_dir: &Path) -> Result<PathBuf, String> {
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let target = env::var("TARGET").unwrap_or_default();
    let compat = shim_dir.join("compat_format.h");
    let compat_text =
        fs::read_to_string(&compat).map_err(|e| format!("reading {}: {e}", compat.display()))?;
    let key = cache::key(&[
        &mlx.prefix.to_string_lossy(),
        &mlx_c.to_string_lossy(),
        &cxx,
        &target,
        &compat_text,
    ]);
    let dir = cache::root()?.join(format!("mlx-c-{MLX_C_VERSION}-{key}"));
    cache::fill_once(&dir, |tmp| {
        let built = cmake::Config::new(mlx_c)
            .out_dir(tmp.join("cmake"))
            .profile("Release")
            .define("MLX_C_USE_SYSTEM_MLX", "ON")
            .define("MLX_DIR", mlx.cmake_dir())
            .define("MLX_C_BUILD_EXAMPLES", "OFF")
            .define("BUILD_SHARED_LIBS", "OFF")
            .define("CMAKE_POSITION_INDEPENDENT_CODE", "ON")
            .cxxflag(format!("-include {}", compat.display()))
            .build_target("mlxc")
            .build();
        let archive = find_file(&built, "libmlxc.a")
            .ok_or("mlx-sys: the mlx-c build produced no libmlxc.a")?;
        fs::create_dir_all(tmp.join("lib")).map_err(|e| e.to_string())?;
        fs::copy(&archive, tmp.join("lib").join("libmlxc.a"))
            .map_err(|e| format!("copying libmlxc.a: {e}"))?;
        fs::remove_dir_all(tmp.join("cmake")).map_err(|e| format!("cleaning the mlx-c build: {e}"))
    })?;
    Ok(dir.join("lib"))
}

fn compile_shim(mlx_c: &Path, mlx: &Mlx, shim_dir: &Path) -> Result<(), String> {
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file(shim_dir.join("linux_shim.cpp"))
        .include(mlx_c)
        .include(mlx.include_dir())
        .flag("-include")
        .flag(shim_dir.join("compat_format.h").to_string_lossy().as_ref())
        .warnings(false)
        .try_compile("mlx_spec_shim")
        .map_err(|e| format!("mlx-sys: compiling the Linux shim: {e}"))
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if entry.file_name() == name {
            return Some(path);
        }
    }
    None
}
