//! Rust bindings for every public mlx-c header, as upstream generates them,
//! with the 16-bit float types mlx-rs expects supplied by hand.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

pub fn generate(mlx_c_root: &Path, prelude: &Path) -> Result<(), String> {
    let header_dir = mlx_c_root.join("mlx").join("c");
    let mut headers: Vec<PathBuf> = fs::read_dir(&header_dir)
        .map_err(|e| format!("reading {}: {e}", header_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();

    let builder = bindgen::Builder::default()
        .rust_target(
            bindgen::RustTarget::stable(73, 0).map_err(|e| format!("bindgen rust target: {e}"))?,
        )
        .clang_arg(format!("-I{}", mlx_c_root.display()))
        .clang_arg("-include")
        .clang_arg(prelude.to_string_lossy())
        .blocklist_type("float16_t")
        .blocklist_type("bfloat16_t")
        // bindgen's `c_ulong` sizes for these trip rustc's
        // suspicious_runtime_symbol_definitions lint; nothing here needs them.
        .blocklist_function("malloc")
        .blocklist_function("realloc")
        .raw_line("/// IEEE half precision, as its raw bits (bindgen's shape for `_Float16`).")
        .raw_line("#[repr(transparent)]")
        .raw_line("#[derive(Debug, Default, Copy, Clone, PartialEq, Eq, Hash)]")
        .raw_line("pub struct float16_t(pub u16);")
        .raw_line("/// bfloat16, as its raw bits.")
        .raw_line("pub type bfloat16_t = u16;");
    let builder = headers
        .iter()
        .fold(builder, |b, h| b.header(h.to_string_lossy()));
    let bindings = builder
        .generate()
        .map_err(|e| format!("mlx-sys: bindgen failed: {e}"))?;
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?)
        .join("bindings.rs");
    bindings
        .write_to_file(&out)
        .map_err(|e| format!("writing {}: {e}", out.display()))
}
