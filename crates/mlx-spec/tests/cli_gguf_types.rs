//! A GGUF model holding every block type a downloaded file mixes (Q5_0,
//! Q5_1, Q3_K and Q5_K among them, which MLX's own GGUF reader refuses),
//! with the default model's tokenizer and random weights: `generate` runs
//! it kept quantized and as float32, and speculation gives plain decoding's
//! text.

mod common;

use std::path::Path;

use common::{generated_text, mlx_spec};
use spec_fixtures::gguf::{random_blocks, GgufFile};
use weights_guard::{GgmlType, GgufValue};

const HIDDEN: u64 = 256;
const KV: u64 = 128;
const MLP: u64 = 512;

/// Layer `l`'s tensors and types: two layers cover the ten block types.
fn layer(l: usize) -> [(&'static str, [u64; 2], GgmlType); 9] {
    let (q, k, v, o, gate, up, down) = if l == 0 {
        use GgmlType::*;
        (Q4_K, Q5_K, Q6_K, Q4_0, Q3_K, Q5_1, Q8_0)
    } else {
        use GgmlType::*;
        (Q5_0, Q4_1, Q8_0, Q5_K, Q2_K, Q4_K, Q6_K)
    };
    [
        ("attn_norm", [HIDDEN, 1], GgmlType::F32),
        ("ffn_norm", [HIDDEN, 1], GgmlType::F32),
        ("attn_q", [HIDDEN, HIDDEN], q),
        ("attn_k", [HIDDEN, KV], k),
        ("attn_v", [HIDDEN, KV], v),
        ("attn_output", [HIDDEN, HIDDEN], o),
        ("ffn_gate", [HIDDEN, MLP], gate),
        ("ffn_up", [HIDDEN, MLP], up),
        ("ffn_down", [MLP, HIDDEN], down),
    ]
}

fn write_model(path: &Path) {
    let source = spec_hub::default_model().expect("default model");
    let (_, metadata) =
        weights_guard::read_gguf(&source, &weights_guard::Limits::default()).expect("read");
    let mut file = GgufFile::default();
    file.kv("general.architecture", GgufValue::String("llama".into()));
    let mut tokenizer: Vec<_> = metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    tokenizer.sort_by(|a, b| a.0.cmp(&b.0));
    let vocab = tokenizer
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map_or(0, |t| t.len() as u64);
    for (key, value) in tokenizer {
        file.kv(&key, value);
    }
    for (key, value) in [
        ("block_count", 2),
        ("embedding_length", HIDDEN as u32),
        ("feed_forward_length", MLP as u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("context_length", 512),
    ] {
        file.kv(&format!("llama.{key}"), GgufValue::U32(value));
    }
    file.kv(
        "llama.attention.layer_norm_rms_epsilon",
        GgufValue::F32(1e-5),
    );
    let mut seed = 1;
    let mut add = |file: &mut GgufFile, name: &str, shape: [u64; 2], ty: GgmlType| {
        let dims: Vec<u64> = shape.into_iter().filter(|&d| d != 1).collect();
        seed += 1;
        let data = random_blocks(ty, dims.iter().product(), seed);
        file.tensor(name, &dims, ty, data);
    };
    add(
        &mut file,
        "token_embd.weight",
        [HIDDEN, vocab],
        GgmlType::Q4_K,
    );
    add(&mut file, "output_norm.weight", [HIDDEN, 1], GgmlType::F32);
    for l in 0..2 {
        for (name, shape, ty) in layer(l) {
            add(&mut file, &format!("blk.{l}.{name}.weight"), shape, ty);
        }
    }
    file.write(path).expect("write gguf");
}

/// The generated text of `generate ARGS`.
fn generated(args: &[&str]) -> String {
    let (ok, stdout, stderr) = mlx_spec(args);
    assert!(ok, "{args:?}: {stderr}");
    generated_text(&stdout)
}

#[test]
fn every_block_type_generates_kept_and_as_float32() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("every-type.gguf");
    write_model(&path);
    let model = path.to_str().expect("utf-8 path");
    let prompt = "one two three one two three one two three one two";
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            prompt,
            "--max-tokens",
            "12",
            "--temp",
            "0",
        ];
        args.extend_from_slice(extra);
        generated(&args)
    };
    let kept = run(&["--keep-dtype"]);
    assert!(!kept.trim().is_empty(), "no text");
    assert_eq!(
        run(&["--keep-dtype", "--draft", "prompt-lookup"]),
        kept,
        "speculation changed the kept model's text"
    );
    let float32 = run(&[]);
    assert!(!float32.trim().is_empty(), "no text");
    assert_eq!(
        run(&["--draft", "prompt-lookup"]),
        float32,
        "speculation changed the float32 model's text"
    );
}
