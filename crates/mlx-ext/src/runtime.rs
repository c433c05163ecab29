//! What MLX runtime this process runs on.

use std::fmt;

/// The BLAS the MLX CPU backend calls for float32 matrix products.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blas {
    /// OpenBLAS, with its configuration string.
    OpenBlas(String),
    /// Anything that is not OpenBLAS: the MLX wheel's bundled reference
    /// (netlib) BLAS on Linux, Accelerate on macOS.
    Other,
}

/// The runtime report shown by the CLI, the demo and the benchmarks.
#[derive(Debug, Clone)]
pub struct RuntimeInfo {
    /// MLX version of the loaded library.
    pub mlx_version: String,
    /// The BLAS this process loaded.
    pub blas: Blas,
    /// How the build wired it (`openblas:<dir>`, `reference`, `accelerate`).
    pub blas_wired: &'static str,
    /// The MLX installation compiled against.
    pub mlx_prefix: &'static str,
    /// The default device, as MLX names it.
    pub device: String,
    /// Our row-invariant float32 GEMM front, as it describes itself; `None`
    /// where it is not loaded (macOS).
    pub gemm: Option<String>,
}

/// Reads the report from the loaded libraries.
pub fn info() -> RuntimeInfo {
    let blas = match mlx_sys::runtime_openblas_config() {
        Some(config) => Blas::OpenBlas(config),
        None => Blas::Other,
    };
    RuntimeInfo {
        mlx_version: mlx_sys::runtime_mlx_version(),
        blas,
        blas_wired: mlx_sys::build_info::BLAS_WIRED,
        mlx_prefix: mlx_sys::build_info::MLX_PREFIX,
        device: format!("{:?}", mlx_rs::Device::default()),
        gemm: mlx_sys::runtime_gemm(),
    }
}

impl fmt::Display for RuntimeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let blas = match &self.blas {
            Blas::OpenBlas(config) => format!("OpenBLAS ({config})"),
            Blas::Other => "not OpenBLAS (reference BLAS or Accelerate)".to_owned(),
        };
        let gemm = self.gemm.as_deref().unwrap_or("the BLAS's own");
        write!(
            f,
            "MLX {} on {}; float32 GEMM: {}; BLAS: {}; wired at build: {}; MLX from {}",
            self.mlx_version, self.device, gemm, blas, self.blas_wired, self.mlx_prefix
        )
    }
}
