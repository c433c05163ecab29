//! A llama GGUF file holding a tensor of each ggml type a downloaded file
//! mixes (written here byte by byte, the blocks random with sane float16
//! fields), read kept (`DtypePolicy::Keep`) and as float32: what MLX's
//! affine layout holds stays quantized with its bits in the config and
//! dequantizes to the float32 read's values; the rest keeps its float type
//! or becomes float32; the header-only footprint equals what was loaded.

use half::f16;
use mlx_ext::quant::{Packed, QuantParams};
use mlx_rs::{Array, Dtype};
use spec_formats::gguf;
use spec_runtime::DtypePolicy;

/// ggml type ids and block geometry (values per block, bytes per block,
/// offsets of the float16 fields).
const F32: (u32, u64, u64, &[usize]) = (0, 1, 4, &[]);
const F16: (u32, u64, u64, &[usize]) = (1, 1, 2, &[]);
const BF16: (u32, u64, u64, &[usize]) = (30, 1, 2, &[]);
const Q4_0: (u32, u64, u64, &[usize]) = (2, 32, 18, &[0]);
const Q4_1: (u32, u64, u64, &[usize]) = (3, 32, 20, &[0, 2]);
const Q5_0: (u32, u64, u64, &[usize]) = (6, 32, 22, &[0]);
const Q5_1: (u32, u64, u64, &[usize]) = (7, 32, 24, &[0, 2]);
const Q8_0: (u32, u64, u64, &[usize]) = (8, 32, 34, &[0]);
const Q4_K: (u32, u64, u64, &[usize]) = (12, 256, 144, &[0, 2]);
const Q5_K: (u32, u64, u64, &[usize]) = (13, 256, 176, &[0, 2]);
const Q6_K: (u32, u64, u64, &[usize]) = (14, 256, 210, &[208]);

type Ty = (u32, u64, u64, &'static [usize]);

const HIDDEN: u64 = 256;
const KV: u64 = 128;
const VOCAB: u64 = 8;

/// One tensor of the file.
struct Row {
    /// The GGUF name.
    name: &'static str,
    /// ggml's shape, row length first (a second dimension of 1: a vector).
    shape: [u64; 2],
    ty: Ty,
    /// The Hugging Face module.
    hf: &'static str,
    /// Bits when kept quantized.
    bits: Option<i32>,
}

const fn row(
    name: &'static str,
    shape: [u64; 2],
    ty: Ty,
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

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Random blocks of `ty` for `elements` values, float16 fields small.
fn data(ty: Ty, elements: u64, seed: u64) -> Vec<u8> {
    let (_, block, bytes, halves) = ty;
    let n = (elements / block * bytes) as usize;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out: Vec<u8> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    if ty.0 == F32.0 || ty.0 == F16.0 || ty.0 == BF16.0 {
        // Finite floats: small values of the type, from the random bytes.
        let width = bytes as usize;
        for (i, v) in out.chunks_exact_mut(width).enumerate() {
            let x = ((i * 37 % 101) as f32 - 50.0) / 128.0;
            match ty.0 {
                0 => v.copy_from_slice(&x.to_le_bytes()),
                1 => v.copy_from_slice(&f16::from_f32(x).to_le_bytes()),
                _ => v.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            }
        }
        return out;
    }
    for (b, block) in out.chunks_exact_mut(bytes as usize).enumerate() {
        for (k, &at) in halves.iter().enumerate() {
            let v = f16::from_f32(((b * 7 + k * 5) % 11) as f32 * 0.002 - 0.009);
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The file: version 3, the llama metadata, then the tensors aligned to 32.
fn write(path: &std::path::Path) {
    let mut out = b"GGUF".to_vec();
    out.extend(3_u32.to_le_bytes());
    out.extend((TENSORS.len() as u64).to_le_bytes());
    let u32s = [
        ("llama.block_count", 1),
        ("llama.embedding_length", HIDDEN as u32),
        ("llama.feed_forward_length", HIDDEN as u32),
        ("llama.attention.head_count", 4),
        ("llama.attention.head_count_kv", 2),
    ];
    out.extend((u32s.len() as u64 + 2).to_le_bytes());
    put_str(&mut out, "general.architecture");
    out.extend(8_u32.to_le_bytes());
    put_str(&mut out, "llama");
    for (key, value) in u32s {
        put_str(&mut out, key);
        out.extend(4_u32.to_le_bytes());
        out.extend(value.to_le_bytes());
    }
    put_str(&mut out, "llama.attention.layer_norm_rms_epsilon");
    out.extend(6_u32.to_le_bytes());
    out.extend(1e-5_f32.to_le_bytes());
    let mut blobs = Vec::new();
    let mut offset = 0_u64;
    for (
        i,
        Row {
            name, shape, ty, ..
        },
    ) in TENSORS.iter().enumerate()
    {
        let dims: Vec<u64> = if shape[1] == 1 {
            vec![shape[0]]
        } else {
            shape.to_vec()
        };
        put_str(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        for d in &dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ty.0.to_le_bytes());
        out.extend(offset.to_le_bytes());
        let blob = data(*ty, dims.iter().product(), i as u64 + 1);
        offset = (offset + blob.len() as u64).next_multiple_of(32);
        blobs.push(blob);
    }
    out.resize(out.len().next_multiple_of(32), 0);
    for blob in blobs {
        out.extend(&blob);
        out.resize(out.len().next_multiple_of(32), 0);
    }
    std::fs::write(path, out).expect("write gguf");
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
            let float = match ty.0 {
                1 => Dtype::Float16,
                30 => Dtype::Bfloat16,
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
