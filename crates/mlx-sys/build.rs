//! Build script of our drop-in `mlx-sys 0.7.0`.
//!
//! Linux: mlx-c 0.7.0 (sources from the registry's `mlx-sys 0.7.0` package) is
//! compiled with CMake against a prebuilt MLX 0.32.2 (the `mlx-cpu` wheel from
//! PyPI, or the prefix in `MLX_DIR`), the runtime is wired to OpenBLAS and
//! linked beside every binary of the profile. macOS: MLX is built from source
//! with Metal, as upstream does.

#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/cache.rs"]
mod cache;
#[path = "build/gemm.rs"]
mod gemm;
#[path = "build/linux.rs"]
mod linux;
#[path = "build/macos.rs"]
mod macos;
#[path = "build/prereqs.rs"]
mod prereqs;
#[path = "build/runtime.rs"]
mod runtime;
#[path = "build/sources.rs"]
mod sources;
#[path = "build/wheel.rs"]
mod wheel;

use std::env;

/// MLX release that mlx-c 0.7.0 pins; headers of any other release do not compile.
pub const MLX_VERSION: &str = "0.32.2";
/// mlx-c release carried by crates.io `mlx-sys 0.7.0`.
pub const MLX_C_VERSION: &str = "0.7.0";

fn main() {
    for var in [
        "MLX_DIR",
        "MLX_SPEC_CACHE_DIR",
        "MLX_SPEC_BLAS",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-changed=gemm");

    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let result = match target_os.as_str() {
        "linux" => linux::build(),
        "macos" => macos::build(),
        other => Err(format!(
            "mlx-sys: target OS `{other}` is not supported (Linux and macOS are)"
        )),
    };
    if let Err(message) = result {
        eprintln!("\nerror: {message}\n");
        std::process::exit(1);
    }
}
