//! mlx-c's sources, taken from the registry's `mlx-sys 0.7.0` package through
//! cargo itself: nothing third-party is committed to this repository.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cache, MLX_C_VERSION};

/// The `mlx-c` source directory of crates.io `mlx-sys =0.7.0`.
pub fn mlx_c_root() -> Result<PathBuf, String> {
    let cache_root = cache::root()?;
    let probe = cache_root.join(format!("mlx-c-{MLX_C_VERSION}-probe"));
    let remembered = probe.join("mlx-c-root.txt");
    if let Ok(path) = fs::read_to_string(&remembered) {
        let path = PathBuf::from(path.trim());
        if path.join("CMakeLists.txt").exists() {
            return Ok(path);
        }
    }
    let root = locate_with_cargo(&probe)?;
    fs::write(&remembered, root.to_string_lossy().as_bytes())
        .map_err(|e| format!("writing {}: {e}", remembered.display()))?;
    Ok(root)
}

/// Resolves a tiny manifest that depends on the registry package: `cargo
/// metadata` downloads and unpacks it and reports where its manifest lies. The
/// manifest has its own `[workspace]`, so it neither sees our
/// `[patch.crates-io]` nor waits on the outer build's lock.
fn locate_with_cargo(probe: &Path) -> Result<PathBuf, String> {
    fs::create_dir_all(probe.join("src"))
        .map_err(|e| format!("creating {}: {e}", probe.display()))?;
    let manifest = probe.join("Cargo.toml");
    let text = format!(
        "[package]\nname = \"mlx-c-source-probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[dependencies]\nmlx-sys = {{ version = \"={MLX_C_VERSION}\", \
         default-features = false }}\n\n[workspace]\n"
    );
    fs::write(&manifest, text).map_err(|e| format!("writing {}: {e}", manifest.display()))?;
    fs::write(probe.join("src/lib.rs"), "").map_err(|e| format!("writing probe lib.rs: {e}"))?;

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .map_err(|e| format!("mlx-sys: running `{cargo} metadata`: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "mlx-sys: `cargo metadata` could not fetch crates.io mlx-sys {MLX_C_VERSION} \
             (the source of mlx-c): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("mlx-sys: parsing `cargo metadata` output: {e}"))?;
    let packages = json["packages"]
        .as_array()
        .ok_or("mlx-sys: `cargo metadata` listed no packages")?;
    let package = packages
        .iter()
        .find(|p| {
            p["name"] == "mlx-sys"
                && p["version"] == MLX_C_VERSION
                && p["source"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("registry+"))
        })
        .ok_or_else(|| {
            format!("mlx-sys: crates.io mlx-sys {MLX_C_VERSION} missing from `cargo metadata`")
        })?;
    let manifest_path = package["manifest_path"]
        .as_str()
        .ok_or("mlx-sys: `cargo metadata` gave no manifest_path for mlx-sys")?;
    let root = Path::new(manifest_path)
        .parent()
        .map(|dir| dir.join("src").join("mlx-c"))
        .ok_or("mlx-sys: manifest_path has no parent")?;
    if !root.join("CMakeLists.txt").exists() {
        return Err(format!(
            "mlx-sys: {} holds no mlx-c sources",
            root.display()
        ));
    }
    Ok(root)
}
