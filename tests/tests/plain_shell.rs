//! Built binaries run from a plain shell: no LD_LIBRARY_PATH, no cargo.

use std::process::Command;

#[test]
fn example_binary_runs_with_a_clean_environment() {
    let exe = mlx_spec_scenarios::profile_dir()
        .join("examples")
        .join("bench_blas");
    assert!(
        exe.exists(),
        "{} is missing: run through `cargo test --workspace`, which builds examples",
        exe.display()
    );
    let out = Command::new(&exe)
        .args(["--sizes", "64", "--min-seconds", "0", "--no-reference"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("spawn bench_blas");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {}: {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("MLX 0.32.2"), "{stdout}");
    if mlx_sys::build_info::BLAS_WIRED.starts_with("openblas") {
        assert!(
            stdout.contains("BLAS: OpenBLAS"),
            "wired to OpenBLAS but loaded another BLAS:\n{stdout}"
        );
    }
}
