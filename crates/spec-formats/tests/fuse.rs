//! `spec_formats::fuse`: an adapter merged into its base model gives the
//! adapted model's logits without the adapter; a quantized base is
//! quantized again (or dequantized on request) with only the adapted
//! modules changed; bad input is an error naming the problem.

use std::collections::HashMap;
use std::path::Path;

use mlx_ext::quant::Packed;
use mlx_rs::Array;
use serde_json::Value;
use spec_core::Target;
use spec_fixtures::adapter::LoraAdapter;
use spec_fixtures::llama::Llama;
use spec_formats::fuse::{fuse_dir, FuseOptions};
use spec_formats::quantize::{quantize_dir, QuantizeError, QuantizeOptions};
use spec_models::{load_model, LoadOptions};
use spec_runtime::config::QuantParams;

/// Two blocks, hidden 64 (groups of 32 divide every input).
const SPEC: Llama = Llama {
    name: "fuse-source",
    layers: 2,
    hidden: 64,
    intermediate: 128,
    tied: false,
    ..Llama::tiny(31)
};

/// LoRA (or DoRA) on the last block, scaled up so that its update is many
/// quantization steps wide.
fn adapter(dora: bool) -> LoraAdapter {
    LoraAdapter {
        dora,
        scale: 20.0,
        ..LoraAdapter::lora(1, 17)
    }
}

fn write_dir(dir: &Path, write: impl FnOnce(&Path)) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    write(dir);
    dir.to_path_buf()
}

/// Every tensor of a written directory (one shard or several).
fn read_all(dir: &Path) -> HashMap<String, Array> {
    let mut all = HashMap::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|x| x == "safetensors") {
            all.extend(Array::load_safetensors(&path).expect("shard"));
        }
    }
    all
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
        .expect("json")
}

/// The logits of a fixed prompt under `options`.
fn logits(dir: &Path, options: &LoadOptions) -> Vec<f32> {
    let target = load_model(dir, options).expect("loads");
    let mut caches = target.make_caches();
    let ids = Array::from_slice(&[5u32, 9, 2, 7, 11, 3], &[1, 6]);
    let out = target.forward(&ids, &mut caches, &[]).expect("forward");
    let logits = target.logits(&out.hidden).expect("logits");
    logits.eval().expect("eval");
    logits.as_slice::<f32>().to_vec()
}

/// Same dtype, shape and values.
fn assert_same(name: &str, a: &Array, b: &Array) {
    assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
    assert!(a.eq_values(b).expect("compare"), "{name} differs");
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `W + scale (A B)^T` in double precision, `W` `[out, in]`, `A` `[in,
/// r]`, `B` `[r, out]`.
fn merged(w: &Array, a: &Array, b: &Array, scale: f64) -> Vec<f64> {
    let (out, inp) = (w.shape()[0] as usize, w.shape()[1] as usize);
    let r = a.shape()[1] as usize;
    let (w, a, b) = (
        w.as_slice::<f32>(),
        a.as_slice::<f32>(),
        b.as_slice::<f32>(),
    );
    let mut m = vec![0.0; out * inp];
    for o in 0..out {
        for i in 0..inp {
            let update: f64 = (0..r)
                .map(|k| f64::from(a[i * r + k]) * f64::from(b[k * out + o]))
                .sum();
            m[o * inp + i] = f64::from(w[o * inp + i]) + scale * update;
        }
    }
    m
}

const MODULE: &str = "model.layers.1.self_attn.q_proj";

#[test]
fn a_fused_model_gives_the_adapted_models_logits_without_the_adapter() {
    let root = tempfile::tempdir().expect("tempdir");
    let base = write_dir(&root.path().join("base"), |d| {
        SPEC.write(d).expect("fixture")
    });
    let plain = logits(&base, &LoadOptions::default());
    for dora in [false, true] {
        let adapter_dir = root.path().join(format!("adapter-{dora}"));
        let lora = adapter(dora);
        write_dir(&adapter_dir, |d| lora.write(d, &SPEC).expect("adapter"));
        let out = root.path().join(format!("fused-{dora}"));
        let report = fuse_dir(&base, &adapter_dir, &out, &FuseOptions::default()).expect("fuses");
        assert_eq!(report.fused.len(), 7, "every projection of the last block");
        assert!(report.dequantized.is_empty() && report.replaced.is_empty());
        assert!(!root.path().join(format!(".fused-{dora}.partial")).exists());

        let adapted = logits(
            &base,
            &LoadOptions {
                adapter: Some(adapter_dir.clone()),
                ..LoadOptions::default()
            },
        );
        let fused = logits(&out, &LoadOptions::default());
        assert!(
            max_diff(&adapted, &plain) > 1e-2,
            "dora {dora}: the adapter must matter"
        );
        // The same sums in another order (merged weight against the
        // runtime's low-rank product): float32 rounding apart.
        let apart = max_diff(&fused, &adapted);
        assert!(apart < 1e-3, "dora {dora}: fused {apart} from adapted");

        // The merged weight itself, against double precision.
        let (src, fused_t) = (read_all(&base), read_all(&out));
        let updates = Array::load_safetensors(adapter_dir.join("adapters.safetensors")).expect("a");
        let want = merged(
            &src[&format!("{MODULE}.weight")],
            &updates[&format!("{MODULE}.lora_a")],
            &updates[&format!("{MODULE}.lora_b")],
            lora.scale,
        );
        let got = fused_t[&format!("{MODULE}.weight")]
            .as_slice::<f32>()
            .to_vec();
        if dora {
            // Each row scaled to its magnitude `m`.
            let m = updates[&format!("{MODULE}.m")].as_slice::<f32>().to_vec();
            let inp = SPEC.hidden;
            for (o, row) in got.chunks(inp).enumerate() {
                let norm = row
                    .iter()
                    .map(|x| f64::from(*x).powi(2))
                    .sum::<f64>()
                    .sqrt();
                assert!(
                    (norm - f64::from(m[o])).abs() < 1e-4,
                    "row {o}: {norm} vs {}",
                    m[o]
                );
                let want_row = &want[o * inp..(o + 1) * inp];
                let want_norm = want_row.iter().map(|x| x * x).sum::<f64>().sqrt();
                for (g, w) in row.iter().zip(want_row) {
                    let w = w * f64::from(m[o]) / want_norm;
                    assert!((f64::from(*g) - w).abs() < 1e-5, "row {o}: {g} vs {w}");
                }
            }
        } else {
            for (g, w) in got.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
            }
        }
        // Blocks the adapter leaves alone, and norms, are copied bit for bit.
        for (name, array) in &src {
            if !name.starts_with("model.layers.1.self_attn")
                && !name.starts_with("model.layers.1.mlp")
            {
                assert_same(name, &fused_t[name], array);
            }
        }
        assert_eq!(config(&out), config(&base));
    }
}

#[test]
fn a_quantized_base_is_quantized_again_or_dequantized_on_request() {
    let root = tempfile::tempdir().expect("tempdir");
    let float = write_dir(&root.path().join("float"), |d| {
        SPEC.write(d).expect("fixture")
    });
    let base = root.path().join("q8");
    quantize_dir(
        &float,
        &base,
        &QuantizeOptions::new(QuantParams::affine(32, 8)),
    )
    .expect("quantizes");
    let adapter_dir = root.path().join("adapter");
    write_dir(&adapter_dir, |d| {
        adapter(false).write(d, &SPEC).expect("adapter")
    });
    let updates = Array::load_safetensors(adapter_dir.join("adapters.safetensors")).expect("a");
    let src = read_all(&base);
    let packed = |t: &HashMap<String, Array>, module: &str| {
        Packed::from_parts(
            t[&format!("{module}.weight")].clone(),
            t[&format!("{module}.scales")].clone(),
            Some(t[&format!("{module}.biases")].clone()),
            QuantParams::affine(32, 8),
        )
        .expect("packed")
    };
    let dense = |p: &Packed| {
        let w = p.dequantize().expect("dequantize");
        w.eval().expect("eval");
        w
    };
    let base_w = dense(&packed(&src, MODULE));
    let want = merged(
        &base_w,
        &updates[&format!("{MODULE}.lora_a")],
        &updates[&format!("{MODULE}.lora_b")],
        adapter(false).scale,
    );
    let update_size = want
        .iter()
        .zip(base_w.as_slice::<f32>())
        .map(|(w, b)| (w - f64::from(*b)).abs())
        .fold(0.0, f64::max);

    // Kept quantized: the adapted module quantized again with its own
    // parameters, within one step of the merged weight; the rest as stored.
    let out = root.path().join("fused");
    let report = fuse_dir(&base, &adapter_dir, &out, &FuseOptions::default()).expect("fuses");
    assert_eq!(report.fused.len(), 7);
    assert!(report.dequantized.is_empty());
    let fused = read_all(&out);
    let step = fused[&format!("{MODULE}.scales")]
        .as_slice::<f32>()
        .iter()
        .fold(0.0f32, |m, s| m.max(s.abs()));
    let got = dense(&packed(&fused, MODULE));
    let error = got
        .as_slice::<f32>()
        .iter()
        .zip(&want)
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max);
    assert!(
        error <= f64::from(step) && update_size > 4.0 * f64::from(step),
        "error {error}, step {step}, update {update_size}"
    );
    for (name, array) in &src {
        if !name.starts_with("model.layers.1.") {
            assert_same(name, &fused[name], array);
        }
    }
    assert_eq!(config(&out), config(&base));
    // Our engine loads it.
    logits(&out, &LoadOptions::default());

    // Dequantized: no packed tensor left, no quantization block; the
    // adapted module is the merged weight, every other its dequantized one.
    let out = root.path().join("fused-float");
    let options = FuseOptions {
        dequantize: true,
        ..FuseOptions::default()
    };
    let report = fuse_dir(&base, &adapter_dir, &out, &options).expect("fuses");
    assert!(report.dequantized.len() > 7, "{:?}", report.dequantized);
    let fused = read_all(&out);
    assert!(!fused.keys().any(|n| n.ends_with(".scales")));
    let cfg = config(&out);
    assert!(cfg.get("quantization").is_none() && cfg.get("quantization_config").is_none());
    for (g, w) in fused[&format!("{MODULE}.weight")]
        .as_slice::<f32>()
        .iter()
        .zip(&want)
    {
        assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
    }
    let other = "model.layers.0.mlp.up_proj";
    assert_eq!(
        fused[&format!("{other}.weight")].as_slice::<f32>(),
        dense(&packed(&src, other)).as_slice::<f32>()
    );
    logits(&out, &LoadOptions::default());
}

#[test]
fn a_full_fine_tune_replaces_its_tensors() {
    let root = tempfile::tempdir().expect("tempdir");
    let base = write_dir(&root.path().join("base"), |d| {
        SPEC.write(d).expect("fixture")
    });
    let src = read_all(&base);
    let name = format!("{MODULE}.weight");
    let replacement = src[&name].multiply(Array::from_f32(-1.0)).expect("negate");
    let adapter_dir = write_dir(&root.path().join("full"), |d| {
        std::fs::write(
            d.join("adapter_config.json"),
            r#"{"fine_tune_type": "full"}"#,
        )
        .expect("config");
        Array::save_safetensors(
            HashMap::from([(name.clone(), replacement.clone())]),
            None,
            d.join("adapters.safetensors"),
        )
        .expect("tensors");
    });
    let out = root.path().join("fused");
    let report = fuse_dir(&base, &adapter_dir, &out, &FuseOptions::default()).expect("fuses");
    assert_eq!(report.replaced, std::slice::from_ref(&name));
    let fused = read_all(&out);
    assert_eq!(
        fused[&name].as_slice::<f32>(),
        replacement.as_slice::<f32>()
    );
    assert_eq!(fused.len(), src.len());
    // The engine's own reading of the same adapter gives the same logits.
    let adapted = logits(
        &base,
        &LoadOptions {
            adapter: Some(adapter_dir.clone()),
            ..LoadOptions::default()
        },
    );
    assert_eq!(logits(&out, &LoadOptions::default()), adapted);
}

#[test]
fn bad_input_is_an_error_naming_the_problem() {
    let root = tempfile::tempdir().expect("tempdir");
    let base = write_dir(&root.path().join("base"), |d| {
        SPEC.write(d).expect("fixture")
    });
    let adapter_dir = root.path().join("adapter");
    write_dir(&adapter_dir, |d| {
        adapter(false).write(d, &SPEC).expect("adapter")
    });
    let fuse = |src: &Path, adapter: &Path, out: &str| {
        fuse_dir(
            src,
            adapter,
            &root.path().join(out),
            &FuseOptions::default(),
        )
        .expect_err("refused")
    };

    // The output exists.
    std::fs::create_dir(root.path().join("taken")).expect("mkdir");
    let err = fuse(&base, &adapter_dir, "taken");
    assert!(matches!(err, QuantizeError::OutputExists { .. }), "{err}");

    // No adapter there.
    let err = fuse(&base, &root.path().join("none"), "out1").to_string();
    assert!(err.contains("no such adapter directory"), "{err}");

    // A checkpoint whose names are not the adapter's (not mlx-lm's layout).
    let renamed = write_dir(&root.path().join("renamed"), |d| {
        let mut tensors = read_all(&base);
        let w = tensors.remove(&format!("{MODULE}.weight")).expect("weight");
        tensors.insert("language_model.q_proj.weight".into(), w);
        Array::save_safetensors(tensors, None, d.join("model.safetensors")).expect("save");
        std::fs::copy(base.join("config.json"), d.join("config.json")).expect("config");
    });
    let err = fuse(&renamed, &adapter_dir, "out2").to_string();
    assert!(
        err.contains(&format!("`{MODULE}.weight`")) && err.contains("mlx-lm's layout"),
        "{err}"
    );
    assert!(!root.path().join("out2").exists() && !root.path().join(".out2.partial").exists());

    // An adapter for more blocks than `num_layers` says.
    let wide = write_dir(&root.path().join("wide"), |d| {
        LoraAdapter::lora(2, 3).write(d, &SPEC).expect("adapter");
        let text = std::fs::read_to_string(d.join("adapter_config.json")).expect("read");
        std::fs::write(
            d.join("adapter_config.json"),
            text.replace("\"num_layers\": 2", "\"num_layers\": 1"),
        )
        .expect("write");
    });
    let err = fuse(&base, &wide, "out3").to_string();
    assert!(
        err.contains("adapts block 0") && err.contains("num_layers"),
        "{err}"
    );

    // An adapter of another rank than its config says.
    let ranked = write_dir(&root.path().join("ranked"), |d| {
        adapter(false).write(d, &SPEC).expect("adapter");
        let text = std::fs::read_to_string(d.join("adapter_config.json")).expect("read");
        std::fs::write(
            d.join("adapter_config.json"),
            text.replace("\"rank\": 4", "\"rank\": 5"),
        )
        .expect("write");
    });
    let err = fuse(&base, &ranked, "out4").to_string();
    assert!(
        err.contains("do not fit") && err.contains("at rank 5"),
        "{err}"
    );
}
