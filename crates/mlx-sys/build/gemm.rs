//! Compiles our BLAS front (`gemm/gemm.c`: `cblas_sgemm`, row-invariant for
//! small M, forwarding the rest) into a shared library of the runtime directory.

use std::path::{Path, PathBuf};
use std::{env, fs};

/// File name (and SONAME) of the front library in the runtime directory.
pub const LIB_NAME: &str = "libmlx_spec_gemm.so";

fn sources() -> Result<(PathBuf, PathBuf), String> {
    let dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?).join("gemm");
    Ok((dir.join("gemm.c"), dir.join("kernel.h")))
}

/// How the front is compiled. -ffp-contract=off: the kernels fuse
/// multiply-adds only where they say so, so every tile shape rounds the same
/// way. -O3: at -O2 GCC keeps the tile accumulators on the stack (about 3x
/// slower).
const FLAGS: &[&str] = &[
    "-O3",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-ffp-contract=off",
    "-fno-fast-math",
];

/// The sources and flags, for the runtime directory's cache key.
pub fn source_text() -> Result<String, String> {
    let (c, h) = sources()?;
    let read =
        |p: &Path| fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()));
    Ok(format!("{}\n{}\n{}", FLAGS.join(" "), read(&c)?, read(&h)?))
}

/// Builds `dir/LIB_NAME`.
pub fn compile(dir: &Path) -> Result<(), String> {
    let (c, _) = sources()?;
    let compiler = cc::Build::new().get_compiler();
    let out = dir.join(LIB_NAME);
    let status = compiler
        .to_command()
        .args(FLAGS)
        .arg(format!("-Wl,-soname,{LIB_NAME}"))
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .args(["-lpthread", "-ldl"])
        .status()
        .map_err(|e| format!("mlx-sys: running the C compiler for {}: {e}", c.display()))?;
    if !status.success() {
        return Err(format!(
            "mlx-sys: compiling {} failed ({status})",
            c.display()
        ));
    }
    Ok(())
}
