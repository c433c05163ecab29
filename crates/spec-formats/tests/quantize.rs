//! `spec_formats::quantize`: quantized tensors are `mlx_rs::ops::quantize`'s
//! bit for bit, the directory has mlx-lm's layout (shards, index, config
//! block, other files) and our engine loads it; bad input is a typed error.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mlx_ext::quant::Packed;
use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};
use spec_core::Target;
use spec_fixtures::llama::Llama;
use spec_fixtures::{Init, TensorSpec};
use spec_formats::quantize::{quantize_dir, ModuleChoice, QuantizeError, QuantizeOptions};
use spec_models::{load_model, DtypePolicy, LoadOptions};
use spec_runtime::config::{QuantMode, QuantParams};

/// The source: `spec_fixtures`' llama at one layer, untied, with the Hub
/// keys. Hidden 64 and intermediate 128: group 128 divides only
/// `down_proj`'s input, and a 64-column weight cannot take group 128.
const SPEC: Llama = Llama {
    name: "quantize-source",
    layers: 1,
    hidden: 64,
    intermediate: 128,
    tied: false,
    hub_extras: true,
    ..Llama::tiny(23)
};

/// Writes the fixture into `dir` (created) and returns its tensors as
/// written.
fn write_source(dir: &Path) -> HashMap<String, Array> {
    std::fs::create_dir_all(dir).expect("mkdir");
    SPEC.write(dir).expect("fixture");
    read_tensors(dir)
}

fn read_tensors(dir: &Path) -> HashMap<String, Array> {
    Array::load_safetensors(dir.join("model.safetensors")).expect("weights")
}

/// Every tensor of an output directory, through its index.
fn read_output(dir: &Path) -> (HashMap<String, Array>, Value) {
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("model.safetensors.index.json")).expect("index"),
    )
    .expect("json");
    let mut all = HashMap::new();
    let map = index["weight_map"].as_object().expect("weight_map");
    let mut files: Vec<&str> = map.values().filter_map(Value::as_str).collect();
    files.sort_unstable();
    files.dedup();
    for file in files {
        let loaded = Array::load_safetensors(dir.join(file)).expect("shard");
        for (name, array) in loaded {
            assert_eq!(map[&name], file, "{name} is listed in another file");
            assert!(all.insert(name, array).is_none());
        }
    }
    assert_eq!(all.len(), map.len(), "index and files disagree");
    (all, index)
}

fn read_config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
        .expect("json")
}

/// Same dtype, shape and bits (floats compared by bit pattern, so -0.0 and
/// 0.0 or two NaNs are told apart as they are in the file).
fn bit_equal(a: &Array, b: &Array) -> bool {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    a.eval().expect("eval");
    b.eval().expect("eval");
    match a.dtype() {
        Dtype::Float32 => a
            .as_slice::<f32>()
            .iter()
            .map(|x| x.to_bits())
            .eq(b.as_slice::<f32>().iter().map(|x| x.to_bits())),
        Dtype::Uint32 => a.as_slice::<u32>() == b.as_slice::<u32>(),
        Dtype::Uint8 => a.as_slice::<u8>() == b.as_slice::<u8>(),
        other => panic!("test tensors are float32, uint32 or uint8, got {other:?}"),
    }
}

/// Checks every output tensor against the source: quantized modules hold
/// exactly `ops::quantize(source, params)` (mlx-rs's own affine op, or
/// `mlx_ext`'s in the floating-point modes, which mlx-rs lacks; the gate
/// compares those with Python's `mx.quantize`), everything else is the
/// source.
fn check_against_source(
    src: &HashMap<String, Array>,
    out: &HashMap<String, Array>,
    params_for: impl Fn(&str) -> Option<QuantParams>,
) -> usize {
    let mut quantized = 0;
    let mut expected_names = 0;
    for (name, w) in src {
        let module = name.strip_suffix(".weight");
        match module
            .and_then(|m| params_for(m).map(|p| (m, p)))
            .filter(|(_, p)| w.ndim() == 2 && w.shape()[1] % p.group_size == 0)
        {
            Some((module, p)) => {
                let (wq, scales, biases) = if p.mode == QuantMode::Affine {
                    let (w, s, b) =
                        mlx_rs::ops::quantize(w, p.group_size, p.bits).expect("quantize");
                    (w, s, Some(b))
                } else {
                    Packed::quantize(w, p).expect("quantize").into_parts()
                };
                assert!(bit_equal(&out[name], &wq), "{name}: packed weight differs");
                assert_eq!(out[name].dtype(), Dtype::Uint32);
                assert!(
                    bit_equal(&out[&format!("{module}.scales")], &scales),
                    "{module}.scales differ"
                );
                match biases {
                    Some(biases) => {
                        assert!(
                            bit_equal(&out[&format!("{module}.biases")], &biases),
                            "{module}.biases differ"
                        );
                        expected_names += 3;
                    }
                    None => {
                        assert!(!out.contains_key(&format!("{module}.biases")));
                        expected_names += 2;
                    }
                }
                quantized += 1;
            }
            None => {
                assert!(bit_equal(&out[name], w), "{name}: must be copied unchanged");
                expected_names += 1;
            }
        }
    }
    assert_eq!(
        out.len(),
        expected_names,
        "output holds other tensors than expected"
    );
    quantized
}

fn logits(dir: &Path, policy: DtypePolicy) -> Vec<f32> {
    let model = load_model(
        dir,
        &LoadOptions {
            dtype: policy,
            progress: None,
            expert_cache_bytes: None,
            mtp_expert_bits: None,
            kv_quantization: None,
            adapter: None,
            max_kv_size: None,
        },
    )
    .expect("our engine loads it");
    let mut caches = model.make_caches();
    let out = model
        .forward(
            &Array::from_slice(&[3u32, 17, 5, 39], &[1, 4]),
            &mut caches,
            &[],
        )
        .expect("forward");
    let logits = model
        .logits(&out.hidden)
        .expect("logits")
        .as_dtype(Dtype::Float32)
        .expect("f32");
    logits.eval().expect("eval");
    logits.as_slice::<f32>().to_vec()
}

#[test]
fn tensors_equal_mlx_quantize_at_every_setting_and_the_engine_loads_them() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    let t = write_source(&src);
    let float_logits = logits(&src, DtypePolicy::Float32);
    let affine = [
        (2, 32),
        (3, 64),
        (4, 64),
        (5, 32),
        (6, 64),
        (8, 32),
        (4, 128),
    ]
    .map(|(bits, group_size)| QuantParams::affine(group_size, bits));
    let fp = [QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8].map(QuantMode::default_params);
    for p in affine.into_iter().chain(fp) {
        let QuantParams {
            mode,
            group_size,
            bits,
        } = p;
        let out = root.path().join(format!("{mode}-q{bits}g{group_size}"));
        let report = quantize_dir(&src, &out, &QuantizeOptions::new(p)).expect("quantize");
        let (written, index) = read_output(&out);
        let quantized = check_against_source(&t, &written, |_| Some(p));
        // Group 128 skips the weights whose input is the 64-wide hidden state.
        let expected = if group_size == 128 { 1 } else { 9 };
        assert_eq!(quantized, expected, "{p}");
        assert_eq!(report.quantized.len(), expected);
        let block = json!({"group_size": group_size, "bits": bits, "mode": mode.as_str()});
        let cfg = read_config(&out);
        assert_eq!(cfg["quantization"], block);
        assert_eq!(cfg["quantization_config"], block);
        assert_eq!(
            cfg["hidden_size"], SPEC.hidden,
            "the rest of the config is kept"
        );
        let total: usize = written.values().map(Array::nbytes).sum();
        assert_eq!(index["metadata"]["total_size"], total as u64);
        let params: usize = t.values().map(Array::size).sum();
        assert_eq!(index["metadata"]["total_parameters"], params as u64);
        assert_eq!(report.shards, 1);
        assert!(out.join("model.safetensors").exists());

        let quant_logits = logits(&out, DtypePolicy::Keep);
        assert_eq!(quant_logits.len(), float_logits.len());
        assert!(quant_logits.iter().all(|x| x.is_finite()));
        if bits == 8 {
            // 8 bits stays close to the float model: a transposed or
            // mis-grouped weight would not. mxfp8 keeps 3 mantissa bits
            // (E4M3): coarser than affine's 256 levels per group.
            let bound = if mode == QuantMode::Mxfp8 { 0.15 } else { 0.05 };
            let scale = float_logits.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = float_logits
                .iter()
                .zip(&quant_logits)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff < bound * scale,
                "{p}: logits off by {diff} (scale {scale})"
            );
        }
    }
}

#[test]
fn small_shard_limit_writes_shards_the_engine_reads_like_one_file() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    write_source(&src);
    let single = root.path().join("single");
    quantize_dir(
        &src,
        &single,
        &QuantizeOptions::new(QuantParams::affine(32, 4)),
    )
    .expect("quantize");
    let sharded = root.path().join("sharded");
    let options = QuantizeOptions {
        max_shard_bytes: 4096,
        ..QuantizeOptions::new(QuantParams::affine(32, 4))
    };
    let report = quantize_dir(&src, &sharded, &options).expect("quantize");
    assert!(report.shards > 2, "{} shards", report.shards);
    for i in 1..=report.shards {
        let file = sharded.join(format!("model-{i:05}-of-{:05}.safetensors", report.shards));
        assert!(file.exists(), "{}", file.display());
    }
    assert!(!sharded.join("model.safetensors").exists());
    let (a, _) = read_output(&single);
    let (b, index) = read_output(&sharded);
    assert_eq!(a.len(), b.len());
    for (name, x) in &a {
        assert!(bit_equal(x, &b[name]), "{name}");
    }
    let keys: Vec<&String> = index["weight_map"]
        .as_object()
        .expect("map")
        .keys()
        .collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "weight map sorted");
    assert_eq!(
        logits(&single, DtypePolicy::Keep),
        logits(&sharded, DtypePolicy::Keep)
    );
}

#[test]
fn predicate_exclusions_and_overrides_are_recorded_and_loadable() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    let t = write_source(&src);
    let out = root.path().join("out");
    let down = QuantParams::affine(32, 8);
    let options = QuantizeOptions {
        predicate: Some(Arc::new(move |m: &str| match m {
            "lm_head" => ModuleChoice::Exclude,
            "model.layers.0.mlp.down_proj" => ModuleChoice::With(down),
            _ => ModuleChoice::Quantize,
        })),
        ..QuantizeOptions::new(QuantParams::affine(64, 4))
    };
    let report = quantize_dir(&src, &out, &options).expect("quantize");
    assert_eq!(report.excluded, ["lm_head"]);
    let (written, _) = read_output(&out);
    let default = QuantParams::affine(64, 4);
    check_against_source(&t, &written, |m| match m {
        "lm_head" => None,
        "model.layers.0.mlp.down_proj" => Some(down),
        _ => Some(default),
    });
    let block = &read_config(&out)["quantization"];
    assert_eq!(block["lm_head"], false);
    assert_eq!(
        block["model.layers.0.mlp.down_proj"],
        json!({"group_size": 32, "bits": 8, "mode": "affine"})
    );
    assert_eq!(block.as_object().expect("object").len(), 5);
    assert!(logits(&out, DtypePolicy::Keep)
        .iter()
        .all(|x| x.is_finite()));
}

#[test]
fn other_files_are_copied_and_progress_counts_every_tensor() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    let t = write_source(&src);
    std::fs::write(src.join("tokenizer.json"), "{\"model\": {}}").expect("tokenizer");
    std::fs::write(src.join("generation_config.json"), "{\"eos_token_id\": 2}")
        .expect("generation config");
    std::fs::write(src.join("pytorch_model.bin"), b"not copied").expect("bin");
    std::fs::create_dir(src.join("subdir")).expect("subdir");
    let calls = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(AtomicUsize::new(0));
    let (c, l) = (calls.clone(), last.clone());
    let options = QuantizeOptions {
        progress: Some(Arc::new(move |done, total| {
            c.fetch_add(1, Ordering::SeqCst);
            assert!(done <= total);
            l.store(done * 1000 + total, Ordering::SeqCst);
        })),
        ..QuantizeOptions::new(QuantParams::affine(64, 4))
    };
    let out = root.path().join("out");
    let report = quantize_dir(&src, &out, &options).expect("quantize");
    assert_eq!(report.copied, ["generation_config.json", "tokenizer.json"]);
    assert_eq!(
        std::fs::read_to_string(out.join("tokenizer.json")).expect("copied"),
        "{\"model\": {}}"
    );
    assert!(!out.join("pytorch_model.bin").exists());
    let n = t.len();
    assert_eq!(calls.load(Ordering::SeqCst), n);
    assert_eq!(last.load(Ordering::SeqCst), n * 1000 + n);
}

#[test]
fn bad_input_is_a_typed_error_and_leaves_nothing_behind() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    write_source(&src);
    let out = root.path().join("out");

    let err = quantize_dir(
        &src,
        &out,
        &QuantizeOptions::new(QuantParams::affine(64, 7)),
    )
    .expect_err("7 bits");
    assert!(
        matches!(&err, QuantizeError::UnsupportedParams { what, .. } if what == "model"),
        "{err}"
    );
    let err = quantize_dir(
        &src,
        &out,
        &QuantizeOptions::new(QuantParams::affine(48, 4)),
    )
    .expect_err("group 48");
    assert!(err.to_string().contains("group size 48"), "{err}");

    let err = quantize_dir(
        &root.path().join("nowhere"),
        &out,
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect_err("no source");
    assert!(err.to_string().contains("config.json"), "{err}");

    // Quantizing a quantized output again is refused, by its config and by its tensors.
    quantize_dir(
        &src,
        &out,
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect("quantize");
    let again = root.path().join("again");
    let err = quantize_dir(
        &out,
        &again,
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect_err("already quantized");
    assert!(
        matches!(&err, QuantizeError::AlreadyQuantized { reason, .. } if reason.contains("quantization")),
        "{err}"
    );
    let stripped = root.path().join("stripped");
    std::fs::create_dir(&stripped).expect("mkdir");
    spec_fixtures::write_config(&stripped, &SPEC.config()).expect("config");
    std::fs::copy(
        out.join("model.safetensors"),
        stripped.join("model.safetensors"),
    )
    .expect("copy");
    let err = quantize_dir(
        &stripped,
        &again,
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect_err("tensors are quantized");
    assert!(
        matches!(&err, QuantizeError::AlreadyQuantized { reason, .. } if reason.contains(".scales")),
        "{err}"
    );

    let err = quantize_dir(
        &src,
        &out,
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect_err("output exists");
    assert!(matches!(err, QuantizeError::OutputExists { .. }), "{err}");

    // A module override that cannot group its weight fails; no output, no leftovers.
    let options = QuantizeOptions {
        predicate: Some(Arc::new(|m: &str| {
            if m == "model.layers.0.mlp.up_proj" {
                ModuleChoice::With(QuantParams::affine(128, 4))
            } else {
                ModuleChoice::Quantize
            }
        })),
        ..QuantizeOptions::new(QuantParams::affine(64, 4))
    };
    let failed = root.path().join("failed");
    let err = quantize_dir(&src, &failed, &options).expect_err("64 % 128");
    assert!(
        matches!(
            err,
            QuantizeError::GroupSizeMismatch {
                columns: 64,
                group_size: 128,
                ..
            }
        ),
        "{err}"
    );
    assert!(!failed.exists());
    let leftovers: Vec<String> = std::fs::read_dir(root.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A truncated weights file is named.
    let broken = root.path().join("broken");
    write_source(&broken);
    let file = broken.join("model.safetensors");
    let bytes = std::fs::read(&file).expect("read");
    std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
    let err = quantize_dir(
        &broken,
        &root.path().join("from-broken"),
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect_err("truncated");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn expert_stacks_are_quantized_as_switch_linear_and_convolutions_kept() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    let experts = "model.layers.0.mlp.switch_mlp.gate_proj.weight";
    let conv = "model.layers.0.conv1d.weight";
    let specs = [
        TensorSpec::new(experts, vec![4, 32, 64], Init::Normal(0.25)),
        TensorSpec::new(conv, vec![64, 4, 64], Init::Normal(0.25)),
    ];
    std::fs::create_dir_all(&src).expect("mkdir");
    spec_fixtures::write_checkpoint(&src, &json!({"model_type": "qwen3_moe"}), &specs, 23, "moe")
        .expect("write");
    let t = read_tensors(&src);
    let out = root.path().join("out");
    let report = quantize_dir(
        &src,
        &out,
        &QuantizeOptions::new(QuantParams::affine(64, 4)),
    )
    .expect("quantize");
    assert_eq!(
        report.quantized,
        ["model.layers.0.mlp.switch_mlp.gate_proj"]
    );
    let (written, _) = read_output(&out);
    let (wq, scales, biases) = mlx_rs::ops::quantize(&t[experts], 64, 4).expect("quantize");
    assert_eq!(written[experts].shape(), &[4, 32, 8]);
    assert!(bit_equal(&written[experts], &wq));
    assert!(bit_equal(
        &written["model.layers.0.mlp.switch_mlp.gate_proj.scales"],
        &scales
    ));
    assert!(bit_equal(
        &written["model.layers.0.mlp.switch_mlp.gate_proj.biases"],
        &biases
    ));
    assert!(bit_equal(&written[conv], &t[conv]));
}

#[test]
fn modes_mixed_per_module_are_recorded_and_load_under_both_policies() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("src");
    let t = write_source(&src);
    let out = root.path().join("out");
    let mxfp4 = QuantMode::Mxfp4.default_params();
    let mxfp8 = QuantMode::Mxfp8.default_params();
    let nvfp4 = QuantMode::Nvfp4.default_params();
    let affine = QuantParams::affine(64, 6);
    let choice = move |m: &str| match m {
        "model.layers.0.mlp.down_proj" => Some(mxfp8),
        "model.layers.0.self_attn.v_proj" => Some(affine),
        "lm_head" => Some(nvfp4),
        _ => None,
    };
    let options = QuantizeOptions {
        predicate: Some(Arc::new(move |m: &str| {
            choice(m).map_or(ModuleChoice::Quantize, ModuleChoice::With)
        })),
        ..QuantizeOptions::new(mxfp4)
    };
    quantize_dir(&src, &out, &options).expect("quantize");
    let (written, _) = read_output(&out);
    let quantized = check_against_source(&t, &written, |m| Some(choice(m).unwrap_or(mxfp4)));
    assert_eq!(quantized, 9);
    let block = &read_config(&out)["quantization"];
    assert_eq!(block["mode"], "mxfp4");
    assert_eq!(
        block["model.layers.0.mlp.down_proj"],
        json!({"group_size": 32, "bits": 8, "mode": "mxfp8"})
    );
    assert_eq!(
        block["model.layers.0.self_attn.v_proj"],
        json!({"group_size": 64, "bits": 6, "mode": "affine"})
    );
    assert_eq!(
        block["lm_head"],
        json!({"group_size": 16, "bits": 4, "mode": "nvfp4"})
    );
    // Kept packed (quantized_matmul per mode) and dequantized to float32
    // (dense matmuls) compute the same model.
    let kept = logits(&out, DtypePolicy::Keep);
    let dense = logits(&out, DtypePolicy::Float32);
    let scale = dense.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = kept
        .iter()
        .zip(&dense)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff < 1e-3 * scale.max(1.0),
        "kept vs float32: {diff} (scale {scale})"
    );
}

/// A `qwen3_moe` checkpoint in Hugging Face's per-expert layout is
/// quantized as mlx-lm's convert quantizes it after its sanitize: the
/// experts stacked into the switch layout (the same bits as quantizing the
/// stacked checkpoint), the router at 8 bits group 64 (the family's
/// predicate, recorded as mlx-lm records it: no mode); our engine loads
/// it; a missing expert is named.
#[test]
fn per_expert_qwen3_moe_tensors_are_stacked_before_quantizing() {
    use spec_fixtures::llama::{Experts, GATE_QWEN3_MOE};
    let stacked_spec = Llama {
        experts: GATE_QWEN3_MOE.experts.map(|e| Experts {
            per_expert: false,
            ..e
        }),
        ..GATE_QWEN3_MOE
    };
    let root = tempfile::tempdir().expect("tempdir");
    let (stacked, hf) = (root.path().join("stacked"), root.path().join("hf"));
    for dir in [&stacked, &hf] {
        std::fs::create_dir_all(dir).expect("mkdir");
        stacked_spec.write(dir).expect("fixture");
    }
    // The same weights with layer 1's experts written one by one.
    let mut tensors = read_tensors(&hf);
    for proj in ["gate_proj", "up_proj", "down_proj"] {
        let all = tensors
            .remove(&format!("model.layers.1.mlp.switch_mlp.{proj}.weight"))
            .expect("stacked");
        for e in 0..8 {
            use mlx_rs::ops::indexing::IndexOp;
            tensors.insert(
                format!("model.layers.1.mlp.experts.{e}.{proj}.weight"),
                all.index(e),
            );
        }
    }
    Array::save_safetensors(&tensors, None, hf.join("model-hf.safetensors")).expect("save");
    std::fs::remove_file(hf.join("model.safetensors")).expect("remove");
    let options = QuantizeOptions::new(QuantParams::affine(32, 4));
    let (q_stacked, q_hf) = (root.path().join("q-stacked"), root.path().join("q-hf"));
    quantize_dir(&stacked, &q_stacked, &options).expect("quantize stacked");
    quantize_dir(&hf, &q_hf, &options).expect("quantize per-expert");
    let ((a, _), (b, _)) = (read_output(&q_stacked), read_output(&q_hf));
    let mut names: Vec<&String> = b.keys().collect();
    names.sort();
    assert_eq!(names, {
        let mut n: Vec<&String> = a.keys().collect();
        n.sort();
        n
    });
    assert!(names.iter().all(|n| !n.contains(".experts.")), "{names:?}");
    for (name, array) in &a {
        assert!(bit_equal(array, &b[name]), "{name}");
    }
    let block = &read_config(&q_hf)["quantization"];
    assert_eq!(
        block["model.layers.1.mlp.gate"],
        json!({"group_size": 64, "bits": 8})
    );
    assert_eq!(
        logits(&q_hf, DtypePolicy::Keep),
        logits(&q_stacked, DtypePolicy::Keep)
    );

    // Expert 3's down projection gone: named.
    let broken = root.path().join("broken");
    std::fs::create_dir_all(&broken).expect("mkdir");
    std::fs::copy(hf.join("config.json"), broken.join("config.json")).expect("config");
    tensors.remove("model.layers.1.mlp.experts.3.down_proj.weight");
    Array::save_safetensors(&tensors, None, broken.join("model.safetensors")).expect("save");
    let err = quantize_dir(&broken, &root.path().join("q-broken"), &options)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("model.layers.1.mlp.experts.3.down_proj.weight") && err.contains("missing"),
        "{err}"
    );
}
