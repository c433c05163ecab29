//! The GEMM front's kernels on the other CPU architecture: `gemm/check.c`
//! with `gemm/gemm.c`, built by a cross compiler and run under QEMU (NEON on
//! x86_64 machines, AVX2 and the portable kernels on aarch64 machines), so
//! every kernel is checked on every CI machine. Needs the cross toolchain and
//! `qemu-user` (`cargo xtask test` installs them).

use std::path::PathBuf;
use std::process::Command;

/// (cross compiler, Debian packages, QEMU command, kernel levels to run).
fn toolchain() -> (
    &'static str,
    &'static str,
    Vec<&'static str>,
    &'static [Option<&'static str>],
) {
    if cfg!(target_arch = "aarch64") {
        (
            "x86_64-linux-gnu-gcc",
            "gcc-x86-64-linux-gnu libc6-dev-amd64-cross qemu-user",
            vec!["qemu-x86_64", "-cpu", "max"],
            &[Some("avx2"), Some("portable")],
        )
    } else {
        (
            "aarch64-linux-gnu-gcc",
            "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user",
            vec!["qemu-aarch64"],
            &[None, Some("portable")],
        )
    }
}

#[test]
fn the_other_architectures_kernels_are_row_invariant() {
    let (cc, packages, qemu, levels) = toolchain();
    let gemm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("gemm");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gemm-check-other-arch");
    let built = Command::new(cc)
        .args(["-O3", "-static", "-std=gnu11", "-ffp-contract=off", "-o"])
        .arg(&exe)
        .arg(gemm.join("check.c"))
        .arg(gemm.join("gemm.c"))
        .args(["-lpthread", "-lm", "-ldl"])
        .output()
        .unwrap_or_else(|e| {
            panic!("`{cc}` did not start ({e}); install it with: apt-get install {packages}")
        });
    assert!(
        built.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    for level in levels {
        let mut cmd = Command::new(qemu[0]);
        cmd.args(&qemu[1..]).arg(&exe);
        if let Some(level) = level {
            cmd.env("MLX_SPEC_GEMM_ISA", level);
        }
        let out = cmd.output().unwrap_or_else(|e| {
            panic!(
                "`{}` did not start ({e}); install it with: apt-get install {packages}",
                qemu[0]
            )
        });
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{level:?}:\n{text}");
        assert!(
            out.status.success(),
            "kernels under {} ({level:?}) failed:\n{text}{}",
            qemu[0],
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(level) = level {
            assert!(
                text.lines().next().is_some_and(|l| l.contains(level)),
                "MLX_SPEC_GEMM_ISA={level} not honoured:\n{text}"
            );
        }
    }
}
