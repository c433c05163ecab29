//! Real files written by other tools pass: the default SmolLM2 GGUF (when the
//! cache holds it; never downloaded here) and a safetensors file written by
//! the `safetensors` crate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use safetensors::tensor::{Dtype, TensorView};
use weights_guard::{check_model_file, GgmlType, Limits, ModelSummary, SafetensorsDtype};

/// Where `spec-hub` caches the default model: `$MLX_SPEC_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/mlx-spec`, else `~/.cache/mlx-spec` (the same rule as
/// `spec_hub::cache_root`, restated to keep this crate independent).
fn smollm2_path() -> Option<PathBuf> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let root = var("MLX_SPEC_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("mlx-spec")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("mlx-spec")))?;
    Some(root.join("models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

#[test]
fn smollm2_gguf_passes() {
    let Some(path) = smollm2_path().filter(|p| p.is_file()) else {
        eprintln!(
            "note: SmolLM2-135M-Instruct.Q4_1.gguf is not in the cache ({:?}); skipping \
             (run `cargo test -p spec-hub` once to fetch it)",
            smollm2_path()
        );
        return;
    };
    let start = Instant::now();
    let summary = match check_model_file(&path).expect("the real model passes") {
        ModelSummary::Gguf(summary) => summary,
        other => panic!("dispatched {path:?} as {other:?}"),
    };
    eprintln!(
        "checked {} in {:?}: GGUF v{}, {} metadata entries, {} tensors",
        path.display(),
        start.elapsed(),
        summary.version,
        summary.metadata_keys.len(),
        summary.tensors.len()
    );
    assert_eq!(summary.architecture.as_deref(), Some("llama"));
    assert!(summary
        .metadata_keys
        .iter()
        .any(|k| k == "tokenizer.ggml.tokens"));
    let by_name: HashMap<&str, _> = summary
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let embd = by_name["token_embd.weight"];
    // SmolLM2-135M: hidden size 576, vocabulary 49152, 30 layers.
    assert_eq!(embd.shape, [576, 49152]);
    assert!(by_name.contains_key("blk.29.attn_q.weight"));
    assert!(summary
        .tensors
        .iter()
        .any(|t| t.ggml_type == GgmlType::Q4_1));
    let file_len = std::fs::metadata(&path).expect("metadata").len();
    let data_end = summary
        .tensors
        .iter()
        .map(|t| summary.data_offset + t.offset + t.byte_len)
        .max()
        .expect("tensors");
    assert!(data_end <= file_len);
}

#[test]
fn safetensors_crate_file_passes() {
    let f32_data: Vec<u8> = (0..12_u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let f16_data = vec![0_u8; 2 * 5];
    let bf16_data = vec![0_u8; 2 * 2 * 3];
    let i64_data = 7_i64.to_le_bytes().to_vec();
    let u8_data = vec![1_u8; 3];
    let views = [
        (
            "model.layers.0.self_attn.q_proj.weight",
            Dtype::F32,
            vec![3, 4],
            &f32_data,
        ),
        ("model.norm.weight", Dtype::F16, vec![5], &f16_data),
        ("lm_head.weight", Dtype::BF16, vec![2, 3], &bf16_data),
        ("step", Dtype::I64, vec![], &i64_data),
        ("mask", Dtype::U8, vec![3, 1], &u8_data),
    ];
    let tensors: Vec<(&str, TensorView<'_>)> = views
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                *name,
                TensorView::new(*dtype, shape.clone(), data).expect("view"),
            )
        })
        .collect();
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.safetensors");
    safetensors::serialize_to_file(tensors, Some(metadata), &path).expect("serialize");

    let summary = match check_model_file(&path).expect("the safetensors crate's file passes") {
        ModelSummary::Safetensors(summary) => summary,
        other => panic!("dispatched as {other:?}"),
    };
    let mut listed: Vec<(String, String, Vec<u64>)> = summary
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.dtype.to_string(), t.shape.clone()))
        .collect();
    listed.sort();
    let mut expected: Vec<(String, String, Vec<u64>)> = views
        .iter()
        .map(|(name, dtype, shape, _)| {
            let shape = shape.iter().map(|&d| d as u64).collect();
            ((*name).to_owned(), dtype.to_string(), shape)
        })
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(
        summary.metadata.get("format").map(String::as_str),
        Some("pt")
    );
    assert!(summary
        .tensors
        .iter()
        .any(|t| t.dtype == SafetensorsDtype::BF16));

    // The safetensors crate itself agrees the file is valid.
    let bytes = std::fs::read(&path).expect("read");
    safetensors::SafeTensors::deserialize(&bytes).expect("safetensors crate reads it");
    weights_guard::check_safetensors_bytes(&bytes, &Limits::default()).expect("bytes variant");
}
