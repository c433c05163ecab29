//! MLX smoke tests on the CPU: the operations every model in this workspace
//! rests on, each checked against an independent reference.

use std::collections::HashMap;

use half::{bf16, f16};
use mlx_rs::io::{GgufFile, GgufMetadataValue};
use mlx_rs::ops::{dequantize, quantize, softmax_axis};
use mlx_rs::{Array, Dtype};

mod common;
use common::values;

#[test]
fn runtime_reports_mlx_and_blas() {
    let info = mlx_ext::runtime::info();
    assert_eq!(info.mlx_version, "0.32.2", "{info}");
    if info.blas_wired.starts_with("openblas") {
        assert!(
            matches!(info.blas, mlx_ext::runtime::Blas::OpenBlas(_)),
            "built for OpenBLAS but the process did not load it: {info}"
        );
    }
}

#[test]
fn f32_matmul_matches_f64_reference() {
    let (m, k, n) = (37, 96, 53);
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let got = Array::from_slice(&a, &[m as i32, k as i32])
        .matmul(Array::from_slice(&b, &[k as i32, n as i32]))
        .expect("matmul");
    assert_eq!(got.shape(), &[m as i32, n as i32]);
    let got = got.as_slice::<f32>();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            let diff = (f64::from(got[i * n + j]) - want).abs();
            assert!(
                diff <= 1e-4 * (1.0 + want.abs()),
                "[{i},{j}]: {} vs {want}",
                got[i * n + j]
            );
        }
    }
}

#[test]
fn softmax_matches_f64_reference() {
    let (rows, cols) = (7, 129);
    let x: Vec<f32> = values(rows * cols, 3).iter().map(|v| v * 20.0).collect();
    let got = softmax_axis(Array::from_slice(&x, &[rows as i32, cols as i32]), -1, None)
        .expect("softmax");
    let got = got.as_slice::<f32>();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let max = row.iter().fold(f64::MIN, |m, &v| m.max(f64::from(v)));
        let total: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
        for c in 0..cols {
            let want = (f64::from(row[c]) - max).exp() / total;
            assert!(
                (f64::from(got[r * cols + c]) - want).abs() < 1e-6,
                "[{r},{c}]"
            );
        }
    }
}

#[test]
fn half_precision_round_trips_through_item_and_slices() {
    // Exactly representable in both formats.
    let exact = [1.5f32, -2.25, 0.125, 1024.0, -0.0, 3.0];
    let x = Array::from_slice(&exact, &[exact.len() as i32]);

    let h = x.as_type::<f16>().expect("to f16");
    assert_eq!(h.dtype(), Dtype::Float16);
    let want: Vec<f16> = exact.iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(h.as_slice::<f16>(), want.as_slice());
    let one = Array::from_slice(&[f16::from_f32(-2.25)], &[1]);
    assert_eq!(one.item_exact::<f16>(), f16::from_f32(-2.25));

    let b = x.as_type::<bf16>().expect("to bf16");
    assert_eq!(b.dtype(), Dtype::Bfloat16);
    let want: Vec<bf16> = exact.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(b.as_slice::<bf16>(), want.as_slice());
    let one = Array::from_slice(&[bf16::from_f32(1024.0)], &[1]);
    assert_eq!(one.item_exact::<bf16>(), bf16::from_f32(1024.0));

    // Rounding, not truncation: 1 + 2^-11 is a tie in f16 (rounds to even: 1.0);
    // 1 + 3 * 2^-12 rounds up to 1 + 2^-10.
    let r = Array::from_slice(&[1.0f32 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-12)], &[2]);
    let r = r.as_type::<f16>().expect("round");
    assert_eq!(
        r.as_slice::<f16>(),
        &[f16::from_f32(1.0), f16::from_f32(1.0 + 2f32.powi(-10))]
    );
    let back = r.as_type::<f32>().expect("widen");
    assert_eq!(back.as_slice::<f32>(), &[1.0, 1.0 + 2f32.powi(-10)]);
}

/// Affine quantization as MLX defines it: per group the grid is anchored at
/// the extreme of larger magnitude with zero exactly on the grid, so the step
/// is the group's range over the levels, nudged to make that edge a whole
/// number of steps. Each element comes back within half a step, except where
/// the nudge left the far end of the range off the grid (then by that gap).
fn check_quantize(bits: i32, group: i32) {
    let (rows, cols) = (8usize, 256usize);
    let w: Vec<f32> = values(rows * cols, 10 + bits as u64 * 100 + group as u64)
        .iter()
        .map(|v| v * 3.0)
        .collect();
    let x = Array::from_slice(&w, &[rows as i32, cols as i32]);
    let (q, scales, biases) = quantize(&x, group, bits).expect("quantize");
    assert_eq!(q.dtype(), Dtype::Uint32);
    assert_eq!(q.shape(), &[rows as i32, cols as i32 * bits / 32]);
    assert_eq!(scales.shape(), &[rows as i32, cols as i32 / group]);
    let back = dequantize(&q, &scales, &biases, group, bits).expect("dequantize");
    let back = back.as_slice::<f32>();
    let scales = scales.as_slice::<f32>();
    let levels = ((1u32 << bits) - 1) as f32;
    let g = group as usize;
    for r in 0..rows {
        for gi in 0..cols / g {
            let span = &w[r * cols + gi * g..r * cols + (gi + 1) * g];
            let (lo, hi) = span
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let step = scales[r * (cols / g) + gi].abs();
            let range = hi - lo;
            assert!(
                step <= 2.0 * range / levels + 1e-6,
                "bits {bits} group {group}: step {step} too coarse"
            );
            let bound = (step * 0.5).max(range - levels * step) + 1e-5;
            for (i, &v) in span.iter().enumerate() {
                let err = (back[r * cols + gi * g + i] - v).abs();
                assert!(
                    err <= bound,
                    "bits {bits} group {group} [{r},{}]: error {err} > bound {bound} (step {step})",
                    gi * g + i
                );
            }
        }
    }
}

#[test]
fn quantize_4_bit_error_bound() {
    check_quantize(4, 32);
    check_quantize(4, 64);
}

#[test]
fn quantize_8_bit_error_bound() {
    check_quantize(8, 32);
    check_quantize(8, 64);
}

#[test]
fn safetensors_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("weights.safetensors");
    let w = values(6 * 5, 4);
    let arrays: HashMap<String, Array> = [
        ("model.w".to_owned(), Array::from_slice(&w, &[6, 5])),
        (
            "model.h".to_owned(),
            Array::from_slice(&w, &[30]).as_type::<f16>().expect("f16"),
        ),
        (
            "model.b".to_owned(),
            Array::from_slice(&w, &[3, 10])
                .as_type::<bf16>()
                .expect("bf16"),
        ),
        (
            "model.ids".to_owned(),
            Array::from_slice(&[7i32, -1, 3], &[3]),
        ),
    ]
    .into_iter()
    .collect();
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);
    Array::save_safetensors(&arrays, &metadata, &path).expect("save");

    let loaded = Array::load_safetensors(&path).expect("load");
    assert_eq!(loaded.len(), arrays.len());
    for (name, want) in &arrays {
        let got = &loaded[name];
        assert_eq!(got.shape(), want.shape(), "{name}");
        assert_eq!(got.dtype(), want.dtype(), "{name}");
        let equal = got.eq(want).expect("eq").all(None).expect("all");
        assert!(
            equal.item_exact::<bool>(),
            "{name} changed in the round trip"
        );
    }

    // The file is standard safetensors: an independent reader agrees.
    let bytes = std::fs::read(&path).expect("read");
    let parsed = safetensors::SafeTensors::deserialize(&bytes).expect("parse");
    let view = parsed.tensor("model.w").expect("model.w");
    assert_eq!(view.shape(), &[6, 5]);
    let raw: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(raw, w);
}

/// Writes a GGUF v3 file by hand, per the format's specification: one string
/// metadata entry, one u32 entry, one f32 tensor of shape [3, 2] (GGUF lists
/// dimensions innermost first).
fn write_gguf(path: &std::path::Path, data: &[f32]) {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend(1u64.to_le_bytes()); // tensors
    out.extend(2u64.to_le_bytes()); // metadata entries
    string(&mut out, "general.name");
    out.extend(8u32.to_le_bytes()); // string
    string(&mut out, "smoke");
    string(&mut out, "smoke.layers");
    out.extend(4u32.to_le_bytes()); // u32
    out.extend(7u32.to_le_bytes());
    string(&mut out, "w");
    out.extend(2u32.to_le_bytes()); // dimensions
    out.extend(2u64.to_le_bytes());
    out.extend(3u64.to_le_bytes());
    out.extend(0u32.to_le_bytes()); // F32
    out.extend(0u64.to_le_bytes()); // offset in the data section
    while out.len() % 32 != 0 {
        out.push(0);
    }
    for v in data {
        out.extend(v.to_le_bytes());
    }
    std::fs::write(path, out).expect("write gguf");
}

#[test]
fn gguf_load_of_a_hand_written_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("smoke.gguf");
    let data = [1.0f32, -2.0, 3.5, 0.25, -8.0, 16.0];
    write_gguf(&path, &data);

    let file = GgufFile::load(&path).expect("load gguf");
    assert_eq!(file.array_keys().expect("keys"), vec!["w".to_owned()]);
    let w = file.get_array("w").expect("get").expect("w present");
    assert_eq!(w.shape(), &[3, 2]);
    assert_eq!(w.as_slice::<f32>(), &data);
    assert_eq!(
        file.get_metadata_string("general.name")
            .expect("meta")
            .as_deref(),
        Some("smoke")
    );
    match file.get_metadata("smoke.layers").expect("meta") {
        Some(GgufMetadataValue::Array(a)) => assert_eq!(a.item_exact::<u32>(), 7),
        other => panic!("smoke.layers: {other:?}"),
    }
    assert!(GgufFile::load(dir.path().join("missing.gguf")).is_err());
}
