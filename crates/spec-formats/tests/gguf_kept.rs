//! A llama GGUF file holding a tensor of each ggml type a downloaded file
//! mixes (`spec_fixtures::gguf`: random blocks with small float16 fields),
//! read kept (`DtypePolicy::Keep`) and as float32: what MLX's
//! affine layout holds stays quantized with its bits in the config and
//! dequantizes to the float32 read's values; the rest keeps its float type
//! or becomes float32; the header-only footprint equals what was loaded.

use mlx_ext::quant::{Packed, QuantParams};
use mlx_rs::{Array, Dtype};
use spec_fixtures::gguf::{random_blocks, GgufFile};
use spec_formats::gguf;
use spec_runtime::DtypePolicy;

use weights_guard::{GgmlType, GgufValue};
use GgmlType::{BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0};

const HIDDEN: u64 = 256;
const KV: u64 = 128;
const VOCAB: u64 = 8;

/// One tensor of the file.
struct Row {
    /// The GGUF name.
    name: &'static str,
    /// ggml's shape, row length first (a second dimension of 1: a vector).
    shape: [u64; 2],
    ty: GgmlType,
    /// The Hugging Face module.
    hf: &'static str,
    /// Bits when kept quantized.
    bits: Option<i32>,
}

const fn row(
    name: &'static str,
    shape: [u64; 2],
    ty: GgmlType,
    hf: &'static str,
    bits: Option<i32>,
) -> Row {
    Row {
        name,
        shape,
        ty,
        hf,
        bits,
    }
}

const TENSORS: &[Row] = &[
    row(
        "token_embd.weight",
        [HIDDEN, VOCAB],
        Q4_K,
        "model.embed_tokens",
        Some(4),
    ),
    row("output_norm.weight", [HIDDEN, 1], F32, "model.norm", None),
    row("output.weight", [HIDDEN, VOCAB], BF16, "lm_head", None),
    row(
        "blk.0.attn_norm.weight",
        [HIDDEN, 1],
        F32,
        "model.layers.0.input_layernorm",
        None,
    ),
    row(
        "blk.0.ffn_norm.weight",
        [HIDDEN, 1],
        F16,
        "model.layers.0.post_attention_layernorm",
        None,
    ),
    row(
        "blk.0.attn_q.weight",
        [HIDDEN, HIDDEN],
        Q5_K,
        "model.layers.0.self_attn.q_proj",
        Some(5),
    ),
    row(
        "blk.0.attn_k.weight",
        [HIDDEN, KV],
        Q5_0,
        "model.layers.0.self_attn.k_proj",
        Some(5),
    ),
    row(
        "blk.0.attn_v.weight",
        [HIDDEN, KV],
        Q6_K,
        "model.layers.0.self_attn.v_proj",
        None,
    ),
    row(
        "blk.0.attn_output.weight",
        [HIDDEN, HIDDEN],
        Q4_0,
        "model.layers.0.self_attn.o_proj",
        Some(4),
    ),
    row(
        "blk.0.ffn_gate.weight",
        [HIDDEN, HIDDEN],
        Q8_0,
        "model.layers.0.mlp.gate_proj",
        Some(8),
    ),
    row(
        "blk.0.ffn_up.weight",
        [HIDDEN, HIDDEN],
        Q5_1,
        "model.layers.0.mlp.up_proj",
        Some(5),
    ),
    row(
        "blk.0.ffn_down.weight",
        [HIDDEN, HIDDEN],
        Q4_1,
        "model.layers.0.mlp.down_proj",
        Some(4),
    ),
];

/// The file: the llama metadata, then the tensors (`spec_fixtures::gguf`).
fn write(path: &std::path::Path) {
    let mut file = GgufFile::default();
    file.kv("general.architecture", GgufValue::String("llama".into()));
    for (key, value) in [
        ("llama.block_count", 1),
        ("llama.embedding_length", HIDDEN as u32),
        ("llama.feed_forward_length", HIDDEN as u32),
        ("llama.attention.head_count", 4),
        ("llama.attention.head_count_kv", 2),
    ] {
        file.kv(key, GgufValue::U32(value));
    }
    file.kv(
        "llama.attention.layer_norm_rms_epsilon",
        GgufValue::F32(1e-5),
    );
    for (
        i,
        Row {
            name, shape, ty, ..
        },
    ) in TENSORS.iter().enumerate()
    {
        let dims: Vec<u64> = shape.iter().copied().filter(|&d| d != 1).collect();
        let data = random_blocks(*ty, dims.iter().product(), i as u64 + 1);
        file.tensor(name, &dims, *ty, data);
    }
    file.write(path).expect("write gguf");
}

#[test]
fn every_type_kept_as_mlx_holds_it_and_dequantized_as_ggml() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mixed.gguf");
    write(&path);
    let kept = gguf::read(&path, DtypePolicy::Keep).expect("kept");
    let dense = gguf::read(&path, DtypePolicy::Float32).expect("float32");
    let quant = &kept.config["quantization"];
    assert_eq!(quant["group_size"], 32, "{quant}");
    let mut loaded = 0;
    for Row { ty, hf, bits, .. } in TENSORS {
        let want = &dense.tensors[&format!("{hf}.weight")];
        assert_eq!(want.dtype(), Dtype::Float32, "{hf}");
        let weight = &kept.tensors[&format!("{hf}.weight")];
        loaded += weight.nbytes();
        let Some(bits) = *bits else {
            // Not held by MLX's affine groups: its float type, or float32.
            let float = match ty {
                F16 => Dtype::Float16,
                BF16 => Dtype::Bfloat16,
                _ => Dtype::Float32,
            };
            assert_eq!(weight.dtype(), float, "{hf}");
            assert!(!kept.tensors.contains_key(&format!("{hf}.scales")), "{hf}");
            let widened = weight.as_dtype(Dtype::Float32).expect("widen");
            assert_eq!(widened.as_slice::<f32>(), want.as_slice::<f32>(), "{hf}");
            continue;
        };
        let scales = kept.tensors[&format!("{hf}.scales")].clone();
        let biases = kept.tensors[&format!("{hf}.biases")].clone();
        assert_eq!(scales.dtype(), Dtype::Float32, "{hf}");
        loaded += scales.nbytes() + biases.nbytes();
        let configured = quant
            .get(*hf)
            .map_or(quant["bits"].clone(), |m| m["bits"].clone());
        assert_eq!(configured, bits, "{hf}: {quant}");
        let packed = Packed::from_parts(
            weight.clone(),
            scales,
            Some(biases),
            QuantParams::affine(32, bits),
        )
        .expect("packed");
        let got = packed.dequantize().expect("dequantize");
        // Equal as numbers (a zero may differ in sign, see `gguf_affine`).
        let first = got
            .as_slice::<f32>()
            .iter()
            .zip(want.as_slice::<f32>())
            .position(|(a, b)| a != b);
        assert_eq!(first, None, "{hf}");
    }
    let print = spec_models::footprint::footprint(&path).expect("footprint");
    let norms = kept.tensors.len() - loaded_names(&kept);
    assert_eq!(norms, 0, "every tensor checked");
    assert_eq!(print.bytes(DtypePolicy::Keep), loaded as u64);
    let dense_bytes: usize = dense.tensors.values().map(Array::nbytes).sum();
    assert_eq!(print.bytes(DtypePolicy::Float32), dense_bytes as u64);
}

/// How many of `checkpoint`'s tensors the table accounts for.
fn loaded_names(checkpoint: &gguf::GgufCheckpoint) -> usize {
    TENSORS
        .iter()
        .map(|Row { hf, .. }| {
            ["weight", "scales", "biases"]
                .iter()
                .filter(|p| checkpoint.tensors.contains_key(&format!("{hf}.{p}")))
                .count()
        })
        .sum()
}
