//! The macOS build, as upstream mlx-sys does it: CMake fetches MLX 0.32.2 and
//! builds it with Metal and Accelerate. Not exercised by our CI (Linux only).

use std::env;
use std::path::PathBuf;

use crate::{bindings, prereqs, sources};

pub fn build() -> Result<(), String> {
    prereqs::cmake()?;
    let mlx_c = sources::mlx_c_root()?;
    let mut config = cmake::Config::new(&mlx_c);
    config
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define(
            "MLX_BUILD_METAL",
            if cfg!(feature = "metal") { "ON" } else { "OFF" },
        )
        .define(
            "MLX_BUILD_ACCELERATE",
            if cfg!(feature = "accelerate") {
                "ON"
            } else {
                "OFF"
            },
        )
        .define("CMAKE_C_COMPILER", "/usr/bin/cc")
        .define("CMAKE_CXX_COMPILER", "/usr/bin/c++");
    if cfg!(feature = "metal-jit") {
        config.define("MLX_METAL_JIT", "ON");
    }
    let dst = config.build();
    let build = dst.join("build");
    println!(
        "cargo:rustc-link-search=native={}",
        build.join("lib").display()
    );
    println!("cargo:rustc-link-search=native={}", build.display());
    println!(
        "cargo:rustc-link-search=native={}",
        build.join("_deps/mlx-build").display()
    );
    println!(
        "cargo:rustc-link-search=native={}",
        build.join("_deps/mlx-build/mlx/io").display()
    );
    for lib in ["mlxc", "mlx", "gguflib"] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    println!("cargo:rustc-link-lib=c++");
    println!("cargo:rustc-link-lib=dylib=objc");
    println!("cargo:rustc-link-lib=framework=Foundation");
    if cfg!(feature = "metal") {
        println!("cargo:rustc-link-lib=framework=Metal");
    }
    if cfg!(feature = "accelerate") {
        println!("cargo:rustc-link-lib=framework=Accelerate");
    }
    println!("cargo:rustc-env=MLX_SYS_BLAS_WIRED=accelerate");
    println!("cargo:rustc-env=MLX_SYS_MLX_PREFIX={}", dst.display());
    println!("cargo:rustc-env=MLX_SYS_RUNTIME_DIR=");
    println!("cargo:rustc-env=MLX_SYS_REFERENCE_LIB_DIR=");
    let shim =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?).join("shim");
    // On Apple silicon half.h declares the real 16-bit types; bindings are the
    // same shape as on Linux.
    bindings::generate(&mlx_c, &shim.join("bindgen_prelude.h"))
}
