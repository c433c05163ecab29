//! A row's float32 numerics do not depend on how many rows share the product:
//! MLX's matmuls here run on our BLAS front (`crates/mlx-sys/gemm`), so a row
//! computed alone, in a verify window or in a batch gives the same bits. On
//! OpenBLAS alone these tests fail (rows differ from about 4 to 13 rows on).

use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::addmm;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

mod common;
use common::values;

fn bits(a: &Array) -> Vec<u32> {
    // Reshaping copies a strided view into a contiguous array.
    let flat = a.reshape(&[-1]).expect("reshape");
    flat.as_slice::<f32>().iter().map(|v| v.to_bits()).collect()
}

fn array(shape: &[i32], seed: u64) -> Array {
    let n = shape.iter().product::<i32>() as usize;
    Array::from_slice(&values(n, seed), shape)
}

/// `x[:m] @ w` for every m up to `rows`: each row equals the row computed alone.
fn check_rows(x: &Array, w: &Array, rows: i32, what: &str) {
    let alone: Vec<Vec<u32>> = (0..rows)
        .map(|r| bits(&x.index(r..r + 1).matmul(w).expect("matmul")))
        .collect();
    for m in 1..=rows {
        let y = x.index(0..m).matmul(w).expect("matmul");
        for (r, want) in alone.iter().enumerate().take(m as usize) {
            let got = bits(&y.index(r as i32..r as i32 + 1));
            assert!(
                &got == want,
                "{what}: row {r} of a {m}-row product differs from the row alone"
            );
        }
    }
}

#[test]
fn the_runtime_uses_the_row_invariant_front() {
    let gemm = mlx_sys::runtime_gemm();
    assert!(
        gemm.as_deref()
            .is_some_and(|g| g.starts_with("row-invariant")),
        "float32 GEMM: {gemm:?}"
    );
    if std::env::var("MLX_SPEC_GEMM_ISA").as_deref() == Ok("portable") {
        assert!(
            gemm.as_deref().is_some_and(|g| g.contains("portable")),
            "MLX_SPEC_GEMM_ISA=portable not honoured: {gemm:?}"
        );
    }
}

/// The tests above ran on the CPU's best kernels; the lower levels it can
/// run (AVX2 on an AVX-512 machine, the portable C everywhere) run them again
/// in child processes, so every kernel is checked on every machine that has it.
#[test]
fn every_kernel_level_is_row_invariant() {
    if std::env::var_os("MLX_SPEC_GEMM_ISA").is_some() {
        return; // a child run
    }
    let exe = std::env::current_exe().expect("test binary");
    let tests = [
        "the_runtime_uses_the_row_invariant_front",
        "projection_rows_do_not_depend_on_the_row_count",
        "attention_rows_do_not_depend_on_the_window",
        "addmm_and_transposed_operands_match_a_float64_reference",
    ];
    for level in ["avx2", "portable"] {
        let out = std::process::Command::new(&exe)
            .args(tests)
            .arg("--exact")
            .env("MLX_SPEC_GEMM_ISA", level)
            .output()
            .expect("running the tests again");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("4 passed"),
            "MLX_SPEC_GEMM_ISA={level}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn projection_rows_do_not_depend_on_the_row_count() {
    // A SmolLM2-sized projection (weights [N, K], used as x @ W.T) ...
    let w = array(&[1536, 576], 2);
    check_rows(
        &array(&[33, 576], 1),
        &w.transpose().expect("transpose"),
        33,
        "576 x 1536, W transposed",
    );
    // ... and odd sizes: K and N tails, B in both layouts.
    check_rows(
        &array(&[20, 77], 3),
        &array(&[45, 77], 4).transpose().expect("transpose"),
        20,
        "77 x 45, W transposed",
    );
    check_rows(
        &array(&[20, 77], 5),
        &array(&[77, 45], 6),
        20,
        "77 x 45, W as is",
    );
}

#[test]
fn attention_rows_do_not_depend_on_the_window() {
    // Grouped-query attention: 6 query heads over 2 key/value heads; a
    // committed context of 40 positions, then windows of 1..=17 queries.
    let (heads, kv_heads, dim, ctx) = (6, 2, 64, 40);
    let queries = array(&[1, heads, 17, dim], 7);
    let keys = array(&[1, kv_heads, ctx + 17, dim], 8);
    let vals = array(&[1, kv_heads, ctx + 17, dim], 9);
    let scale = 1.0 / (dim as f32).sqrt();
    let alone: Vec<Vec<u32>> = (0..17)
        .map(|j| {
            let q = queries.index((.., .., j..j + 1, ..));
            let k = keys.index((.., .., 0..ctx + j + 1, ..));
            let v = vals.index((.., .., 0..ctx + j + 1, ..));
            bits(&scaled_dot_product_attention(&q, &k, &v, scale, None, None).expect("sdpa"))
        })
        .collect();
    for m in 1..=17 {
        let q = queries.index((.., .., 0..m, ..));
        let k = keys.index((.., .., 0..ctx + m, ..));
        let v = vals.index((.., .., 0..ctx + m, ..));
        let mask = if m > 1 {
            Some(ScaledDotProductAttentionMask::Causal)
        } else {
            None
        };
        let out = scaled_dot_product_attention(&q, &k, &v, scale, mask, None).expect("sdpa");
        for (j, want) in alone.iter().enumerate().take(m as usize) {
            let got = bits(&out.index((.., .., j as i32..j as i32 + 1, ..)));
            assert!(
                &got == want,
                "query {j} of a {m}-query window differs from the query alone"
            );
        }
    }
}

/// The front's arithmetic against a float64 reference: `alpha * a @ b + beta * c`
/// with A transposed in memory (MLX passes it as such) and both B layouts.
#[test]
fn addmm_and_transposed_operands_match_a_float64_reference() {
    let (m, k, n) = (9, 70, 37);
    let a_t = values(k * m, 11); // A stored as [K, M]
    let b = values(k * n, 12); // [K, N]
    let c = values(m * n, 13);
    let (alpha, beta) = (0.75_f32, -1.5_f32);
    let a_arr = Array::from_slice(&a_t, &[k as i32, m as i32])
        .transpose()
        .expect("transpose");
    let b_arr = Array::from_slice(&b, &[k as i32, n as i32]);
    let b_by_rows = Array::from_slice(&b, &[k as i32, n as i32])
        .transpose()
        .expect("t")
        .multiply(Array::from_f32(1.0))
        .expect("copy");
    let c_arr = Array::from_slice(&c, &[m as i32, n as i32]);
    for (label, b_used) in [
        ("B as is", b_arr),
        ("B transposed", b_by_rows.transpose().expect("t")),
    ] {
        let got = addmm(&c_arr, &a_arr, &b_used, alpha, beta).expect("addmm");
        let got = got.as_slice::<f32>();
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k)
                    .map(|p| f64::from(a_t[p * m + i]) * f64::from(b[p * n + j]))
                    .sum();
                let want = f64::from(alpha) * dot + f64::from(beta) * f64::from(c[i * n + j]);
                let diff = (f64::from(got[i * n + j]) - want).abs();
                assert!(
                    diff <= 1e-4 * (1.0 + want.abs()),
                    "{label} [{i},{j}]: {} vs {want}",
                    got[i * n + j]
                );
            }
        }
    }
}
