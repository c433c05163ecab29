//! Raw bindings to mlx-c 0.7.0 (our drop-in for crates.io `mlx-sys 0.7.0`),
//! plus the facts of how this build was wired: which MLX, which BLAS.
//!
//! This is the only crate of the workspace that holds FFI.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(missing_docs)]
#![allow(missing_debug_implementations)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// How the build script wired MLX, recorded at compile time.
pub mod build_info {
    /// `openblas:<dir>` when the runtime loads OpenBLAS, `reference` when it
    /// keeps the BLAS MLX was built with, `accelerate` on macOS.
    pub const BLAS_WIRED: &str = env!("MLX_SYS_BLAS_WIRED");
    /// The MLX installation prefix compiled against.
    pub const MLX_PREFIX: &str = env!("MLX_SYS_MLX_PREFIX");
    /// The directory the runtime `libmlx` is loaded from (empty on macOS).
    pub const RUNTIME_DIR: &str = env!("MLX_SYS_RUNTIME_DIR");
    /// A directory whose `libmlx` loads the wheel's bundled reference BLAS,
    /// for benchmarks that compare (`LD_LIBRARY_PATH=<it>`); empty when the
    /// runtime already uses that BLAS or MLX did not come from the wheel.
    pub const REFERENCE_LIB_DIR: &str = env!("MLX_SYS_REFERENCE_LIB_DIR");
}

#[cfg(target_os = "linux")]
extern "C" {
    fn mlx_spec_blas_config() -> *const std::os::raw::c_char;
    fn mlx_spec_gemm_config() -> *const std::os::raw::c_char;
}

/// How this process computes float32 matrix products: our row-invariant
/// front's description (e.g. `row-invariant avx512f, M <= 64, 2 threads`,
/// or that `MLX_SPEC_GEMM=blas` turned it off), or `None` when the front is
/// not loaded (macOS).
pub fn runtime_gemm() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the shim returns NULL or the front's static, NUL-terminated
        // description, valid for the life of the process.
        let ptr = unsafe { mlx_spec_gemm_config() };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated (see above).
        let text = unsafe { std::ffi::CStr::from_ptr(ptr) };
        Some(text.to_string_lossy().into_owned())
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The BLAS this process actually loaded: OpenBLAS's configuration string
/// (e.g. `OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64`),
/// or `None` when it is not OpenBLAS (the wheel's reference BLAS, or
/// Accelerate on macOS).
pub fn runtime_openblas_config() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the shim returns NULL or OpenBLAS's static, NUL-terminated
        // configuration string.
        let ptr = unsafe { mlx_spec_blas_config() };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: non-null pointers come from `openblas_get_config`, valid for
        // the life of the process.
        let text = unsafe { std::ffi::CStr::from_ptr(ptr) };
        Some(text.to_string_lossy().trim().to_owned())
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The version string of the loaded MLX library (e.g. `0.32.2`).
pub fn runtime_mlx_version() -> String {
    // SAFETY: the string is created, read and freed exactly once, as mlx-c
    // documents; its data is copied before the free.
    unsafe {
        let mut s = mlx_string_new();
        let mut text = String::from("unknown");
        if mlx_version(&mut s) == 0 {
            let ptr = mlx_string_data(s);
            if !ptr.is_null() {
                text = std::ffi::CStr::from_ptr(ptr).to_string_lossy().into_owned();
            }
        }
        mlx_string_free(s);
        text
    }
}
