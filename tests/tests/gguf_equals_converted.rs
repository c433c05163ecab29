//! The real model loaded straight from GGUF equals the same model converted
//! to an mlx-lm directory (the directory the parity gate checks against
//! mlx-lm), bit for bit.

use mlx_rs::{Array, Dtype};
use spec_core::Target;
use spec_formats::gguf;
use spec_models::{load_model, DtypePolicy, LoadOptions};

fn logits(model: &dyn Target, prompt: &[u32]) -> Vec<f32> {
    let mut caches = model.make_caches();
    let out = model
        .forward(
            &Array::from_slice(prompt, &[1, prompt.len() as i32]),
            &mut caches,
            &[],
        )
        .expect("forward");
    let l = model.logits(&out.hidden).expect("logits");
    l.eval().expect("eval");
    l.as_slice::<f32>().to_vec()
}

#[test]
fn gguf_model_equals_its_converted_directory() {
    let gguf_path = spec_hub::default_model().expect("default model");
    let f32 = LoadOptions {
        dtype: DtypePolicy::Float32,
        ..LoadOptions::default()
    };
    let direct = load_model(&gguf_path, &f32).expect("load gguf");
    let dir = tempfile::tempdir().expect("tempdir");
    gguf::convert_to_dir(&gguf_path, dir.path(), DtypePolicy::Float32).expect("convert");
    let converted = load_model(dir.path(), &LoadOptions::default()).expect("load converted");
    assert_eq!(direct.info(), converted.info());
    let prompt = [1u32, 504, 3458, 282, 4649, 314, 2114, 30];
    let (a, b) = (logits(&direct, &prompt), logits(&converted, &prompt));
    assert_eq!(a.len(), prompt.len() * 49152);
    assert!(a == b, "logits differ");
    // The q/k permutation was undone: a tied SmolLM2 answering "France"
    // questions is not possible with scrambled rotary rows, so the model's
    // top next token after "The capital of France is" must be " Paris".
    let tokenizer = spec_text::Tokenizer::from_gguf(&gguf_path).expect("tokenizer");
    let ids = tokenizer
        .encode("The capital of France is", false)
        .expect("encode");
    let l = logits(&direct, &ids);
    let last = &l[(ids.len() - 1) * 49152..];
    let best = last
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map(|(i, _)| i as u32)
        .expect("argmax");
    assert_eq!(
        tokenizer.decode(&[best], false).expect("decode").trim(),
        "Paris"
    );
}

#[test]
fn truncated_gguf_is_an_error_naming_the_file() {
    let gguf_path = spec_hub::default_model().expect("default model");
    let bytes = std::fs::read(&gguf_path).expect("read");
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, len) in [("half.gguf", bytes.len() / 2), ("header-only.gguf", 1000)] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes[..len]).expect("write");
        let err = load_model(&path, &LoadOptions::default())
            .expect_err("must fail")
            .to_string();
        // weights-guard refuses it before MLX reads it.
        assert!(
            err.contains(name) && (err.contains("the file has") || err.contains("remain")),
            "{err}"
        );
    }
}

/// The header estimate a host chooses a dtype by equals what the real GGUF
/// model holds once loaded, under either policy.
#[test]
fn gguf_footprint_equals_the_loaded_weights() {
    let gguf_path = spec_hub::default_model().expect("default model");
    let print = spec_models::footprint::footprint(&gguf_path).expect("footprint");
    for policy in [DtypePolicy::Float32, DtypePolicy::Keep] {
        let options = LoadOptions {
            dtype: policy,
            ..LoadOptions::default()
        };
        let model = load_model(&gguf_path, &options).expect("load gguf");
        assert_eq!(
            print.bytes(policy),
            model.weights_bytes() as u64,
            "{policy:?}: {print:?}"
        );
    }
    assert!(print.stored * 4 < print.float32, "a Q4_1 file: {print:?}");
}

/// Kept quantized, the real (Q4_1) file's tensors are laid out as MLX's own
/// GGUF reader lays them out: the same packed words, the same scales and
/// biases (widened from its float16 to float32, where MLX's float16
/// dequantization would round ggml's float32 values).
#[test]
fn kept_q4_1_tensors_are_mlx_readers_layout() {
    let gguf_path = spec_hub::default_model().expect("default model");
    let ours = gguf::read(&gguf_path, DtypePolicy::Keep).expect("read kept");
    let file = mlx_rs::io::GgufFile::load(&gguf_path).expect("MLX's reader");
    let theirs = file.arrays().expect("arrays");
    // Modules llama.cpp does not permute (q/k are, and undone by ours).
    for (gguf_name, hf) in [
        ("token_embd", "model.embed_tokens"),
        ("blk.0.attn_v", "model.layers.0.self_attn.v_proj"),
        ("blk.3.ffn_down", "model.layers.3.mlp.down_proj"),
        ("blk.29.ffn_up", "model.layers.29.mlp.up_proj"),
    ] {
        let theirs_weight = &theirs[&format!("{gguf_name}.weight")];
        let ours_weight = &ours.tensors[&format!("{hf}.weight")];
        assert_eq!(ours_weight.dtype(), Dtype::Uint32, "{hf}");
        assert_eq!(
            ours_weight.as_slice::<u32>(),
            theirs_weight.as_slice::<u32>(),
            "{hf}"
        );
        for part in ["scales", "biases"] {
            let theirs = theirs[&format!("{gguf_name}.{part}")]
                .as_dtype(Dtype::Float32)
                .expect("widen");
            let ours = &ours.tensors[&format!("{hf}.{part}")];
            assert_eq!(ours.dtype(), Dtype::Float32, "{hf}.{part}");
            assert_eq!(
                ours.as_slice::<f32>(),
                theirs.as_slice::<f32>(),
                "{hf}.{part}"
            );
        }
    }
}
