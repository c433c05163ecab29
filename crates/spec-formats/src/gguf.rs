//! Llama-family checkpoints (`llama`, `qwen2`, `qwen3`, `qwen3moe`) straight from a GGUF
//! file (llama.cpp's format): its header and metadata read by
//! `weights_guard::read_gguf`, each tensor's bytes read from the file
//! (never through MLX's GGUF reader, which would hold every tensor of the
//! file in memory, the k-quants widened to float16), tensors renamed to
//! Hugging Face names, llama.cpp's q/k row permutation undone (`llama` only:
//! its converter permutes no other family), the configuration rebuilt from
//! the metadata. Quantized tensors are dequantized to float32 exactly as
//! ggml does (`gguf_dequant`) or, under `DtypePolicy::Keep`, kept in MLX's
//! affine layout where it holds ggml's values exactly (`gguf_affine`: Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K); float16 and bfloat16 stay so under
//! `Keep`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use mlx_rs::Array;

use weights_guard::{GgmlType, GgufMetadata, GgufSummary, GgufTensor, GgufValue};

use crate::{gguf_affine, gguf_dequant};
use crate::{DtypePolicy, ModelError};

mod rope;

/// A GGUF checkpoint in Hugging Face terms.
#[derive(Debug)]
pub struct GgufCheckpoint {
    /// The file.
    pub path: PathBuf,
    /// A `config.json` equivalent (with a `quantization` block when tensors
    /// stay quantized).
    pub config: serde_json::Value,
    /// Tensors under Hugging Face names.
    pub tensors: std::collections::HashMap<String, Array>,
}

fn bad(path: &Path, message: impl Into<String>) -> ModelError {
    ModelError::WeightsFile {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// A reader's or check's error on `path`, kept as the `source()`.
fn checked(
    path: &Path,
    context: &'static str,
    error: impl Into<spec_core::error::BoxError>,
) -> ModelError {
    ModelError::WeightsCheck {
        path: path.to_path_buf(),
        context,
        source: error.into(),
    }
}

/// Typed reads of the file's metadata whose errors name the file and key.
struct Meta<'a> {
    metadata: &'a GgufMetadata,
    path: &'a Path,
}

impl Meta<'_> {
    /// A number, stored as one (what llama.cpp writes) or as an array of
    /// one (what MLX's GGUF writer makes of a scalar).
    fn number(&self, key: &str) -> Result<Option<f64>, ModelError> {
        let Some(value) = self.metadata.get(key) else {
            return Ok(None);
        };
        let single = match value.as_array() {
            Some([one]) => one,
            _ => value,
        };
        single.as_f64().map(Some).ok_or_else(|| {
            bad(
                self.path,
                format!(
                    "metadata {key}: expected a number, found {}",
                    describe(value)
                ),
            )
        })
    }

    fn required(&self, key: &str) -> Result<f64, ModelError> {
        self.number(key)?
            .ok_or_else(|| bad(self.path, format!("metadata {key} is missing")))
    }

    fn string(&self, key: &str) -> Result<Option<String>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(bad(
                self.path,
                format!(
                    "metadata {key}: expected a string, found {}",
                    describe(other)
                ),
            )),
        }
    }
}

/// A value's type as errors name it (an array with its length).
fn describe(value: &GgufValue) -> String {
    match value.as_array() {
        Some(items) => format!("an array of {}", items.len()),
        None => format!("a {}", value.type_name()),
    }
}

/// GGUF tensor name (after `blk.N.`) -> Hugging Face name (after `model.layers.N.`).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
    ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
    ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
];

fn hf_module(gguf_module: &str) -> Option<String> {
    match gguf_module {
        "token_embd" => return Some("model.embed_tokens".into()),
        "output_norm" => return Some("model.norm".into()),
        "output" => return Some("lm_head".into()),
        _ => {}
    }
    let rest = gguf_module.strip_prefix("blk.")?;
    let (layer, name) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    LAYER_NAMES
        .iter()
        .find(|(g, _)| *g == name)
        .map(|(_, hf)| format!("model.layers.{layer}.{hf}"))
}

/// The `general.architecture` values we read, each with its Hugging Face
/// model type.
const ARCHITECTURES: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("qwen3moe", "qwen3_moe"),
];

/// Undoes llama.cpp's rotary row order for q/k (a weight's rows, or a
/// bias): rows `(head, pair, half)` back to `(head, half, pair)`.
fn unpermute(rows: &Array, heads: i32) -> Result<Array, ModelError> {
    let shape = rows.shape().to_vec();
    let out = shape[0];
    let half = out / heads / 2;
    let mut split = vec![heads, half, 2];
    split.extend_from_slice(&shape[1..]);
    Ok(rows.reshape(&split)?.swap_axes(1, 2)?.reshape(&shape)?)
}

/// Reads a llama GGUF into Hugging Face names and config.
pub fn read(path: &Path, policy: DtypePolicy) -> Result<GgufCheckpoint, ModelError> {
    if !path.exists() {
        return Err(ModelError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    // Our own header reader: MLX never sees the file.
    let (summary, metadata) = weights_guard::read_gguf(path, &weights_guard::Limits::default())
        .map_err(|e| checked(path, "", e))?;
    let meta = Meta {
        metadata: &metadata,
        path,
    };
    let arch = meta
        .string("general.architecture")?
        .ok_or_else(|| bad(path, "metadata general.architecture is missing"))?;
    let Some(&(_, model_type)) = ARCHITECTURES.iter().find(|(a, _)| *a == arch) else {
        let names: Vec<&str> = ARCHITECTURES.iter().map(|(a, _)| *a).collect();
        return Err(ModelError::UnsupportedArchitecture {
            path: path.to_path_buf(),
            model_type: arch,
            supported: format!("{} (GGUF)", names.join(", ")),
        });
    };
    let key = |name: &str| format!("{arch}.{name}");
    let heads = meta.required(&key("attention.head_count"))? as i32;
    let kv_heads = meta
        .number(&key("attention.head_count_kv"))?
        .map_or(heads, |v| v as i32);
    let hidden = meta.required(&key("embedding_length"))? as i32;
    let permutes = arch == "llama";

    // Group the tensors by module: `weight`, and `bias` where there is one.
    let mut modules: BTreeMap<&str, Vec<(&str, &GgufTensor)>> = BTreeMap::new();
    for tensor in &summary.tensors {
        let (module, part) = tensor
            .name
            .rsplit_once('.')
            .ok_or_else(|| bad(path, format!("tensor `{}` has no part suffix", tensor.name)))?;
        modules.entry(module).or_default().push((part, tensor));
    }
    let mut reader = TensorReader::open(path, &summary)?;
    let mut tensors = std::collections::HashMap::new();
    let mut overrides = serde_json::Map::new();
    let mut has_bias = false;
    let mut rope_factors = None;
    for (&module, parts) in &modules {
        if module == "rope_freqs" {
            let (_, weight) = parts
                .iter()
                .find(|(part, _)| *part == "weight")
                .ok_or_else(|| bad(path, "`rope_freqs` has no weight"))?;
            rope_factors = Some(reader.float32(weight)?);
            continue;
        }
        let hf = hf_module(module).ok_or_else(|| {
            bad(
                path,
                format!("tensor `{module}` has no Hugging Face counterpart we know"),
            )
        })?;
        let permute_heads = if !permutes {
            None
        } else if hf.ends_with("q_proj") {
            Some(heads)
        } else if hf.ends_with("k_proj") {
            Some(kv_heads)
        } else {
            None
        };
        let fix = |a: Array| -> Result<Array, ModelError> {
            match permute_heads {
                Some(h) => unpermute(&a, h),
                None => Ok(a),
            }
        };
        for &(part, tensor) in parts {
            match part {
                // A bias (`qwen2`'s q/k/v) is a float vector: never kept
                // quantized.
                "bias" => {
                    let bias = reader.load(tensor, policy, false)?;
                    tensors.insert(format!("{hf}.bias"), fix(bias.dense(path)?)?);
                    has_bias = true;
                }
                "weight" => match reader.load(tensor, policy, true)? {
                    Loaded::Dense(weight) => {
                        tensors.insert(format!("{hf}.weight"), fix(weight)?);
                    }
                    Loaded::Affine {
                        weight,
                        scales,
                        biases,
                        bits,
                    } => {
                        tensors.insert(format!("{hf}.weight"), fix(weight)?);
                        tensors.insert(format!("{hf}.scales"), fix(scales)?);
                        tensors.insert(format!("{hf}.biases"), fix(biases)?);
                        if bits != 4 {
                            overrides.insert(
                                hf.clone(),
                                serde_json::json!({"group_size": 32, "bits": bits}),
                            );
                        }
                    }
                },
                other => {
                    return Err(bad(
                        path,
                        format!("`{module}` has an unexpected part `{other}`"),
                    ))
                }
            }
        }
        if !tensors.contains_key(&format!("{hf}.weight")) {
            return Err(bad(path, format!("`{module}` has no weight")));
        }
    }
    if policy == DtypePolicy::Keep {
        let mut widened: BTreeMap<String, usize> = BTreeMap::new();
        for t in &summary.tensors {
            if t.ggml_type != GgmlType::F32 && !kept(t.ggml_type, policy) {
                *widened.entry(t.ggml_type.to_string()).or_default() += 1;
            }
        }
        if !widened.is_empty() {
            tracing::info!(
                path = %path.display(),
                ?widened,
                "tensors loaded as float32 under keep: MLX's affine groups of 32 cannot hold \
                 these types' values exactly"
            );
        }
    }
    // ggml's shape lists the row length first: the embedding's rows are
    // its second dimension.
    let vocab = modules
        .get("token_embd")
        .and_then(|parts| parts.iter().find(|(part, _)| *part == "weight"))
        .and_then(|(_, t)| t.shape.get(1).copied());
    let vocab = vocab.ok_or_else(|| bad(path, "no token_embd tensor"))?;
    let layers = meta.required(&key("block_count"))? as usize;
    let experts = meta.number(&key("expert_count"))?;
    // An all-expert model may leave the dense width out.
    let dense_width = match meta.number(&key("feed_forward_length"))? {
        Some(width) => width,
        None if experts.is_some() => 0.0,
        None => meta.required(&key("feed_forward_length"))?,
    };
    let rope_theta = meta.number(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    let mut config = serde_json::json!({
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": dense_width as i64,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": meta.required(&key("attention.layer_norm_rms_epsilon"))?,
        "vocab_size": vocab,
        "rope_theta": rope_theta,
        "max_position_embeddings": meta.number(&key("context_length"))?.map(|v| v as i64),
        "attention_bias": has_bias,
        "tie_word_embeddings": !tensors.contains_key("lm_head.weight"),
    });
    if let Some(experts) = experts {
        // llama.cpp's `qwen3moe`: every layer holding `ffn_gate_exps` is an
        // expert block, its top-k weights normalized (the model's
        // `norm_topk_prob`, which the converter does not record).
        let dense: Vec<usize> = (0..layers)
            .filter(|l| !modules.contains_key(format!("blk.{l}.ffn_gate_exps").as_str()))
            .collect();
        config["num_experts"] = (experts as i64).into();
        config["num_experts_per_tok"] = (meta.required(&key("expert_used_count"))? as i64).into();
        config["moe_intermediate_size"] =
            (meta.required(&key("expert_feed_forward_length"))? as i64).into();
        config["norm_topk_prob"] = true.into();
        config["decoder_sparse_step"] = 1.into();
        config["mlp_only_layers"] = dense.into();
    }
    let head_dim = meta.number(&key("attention.key_length"))?.map(|v| v as i32);
    if let Some(head_dim) = head_dim {
        config["head_dim"] = head_dim.into();
    }
    let head_dim = head_dim.unwrap_or(hidden / heads);
    if let Some(rotated) = meta.number(&key("rope.dimension_count"))? {
        if rotated as i32 != head_dim {
            return Err(bad(
                path,
                format!(
                    "metadata {}: rotary embedding over {rotated} of {head_dim} dimensions \
                     is not supported",
                    key("rope.dimension_count")
                ),
            ));
        }
    }
    let scaling = match rope_factors {
        Some(factors) => {
            Some(rope::llama3_scaling(&factors, rope_theta, head_dim).map_err(|m| bad(path, m))?)
        }
        None => rope::scaling(&meta, &key)?,
    };
    if let Some(scaling) = scaling {
        config["rope_scaling"] = scaling;
    }
    if policy == DtypePolicy::Keep && tensors.keys().any(|k| k.ends_with(".scales")) {
        let mut block = serde_json::json!({"group_size": 32, "bits": 4});
        if let Some(obj) = block.as_object_mut() {
            obj.extend(overrides);
        }
        config["quantization"] = block;
    }
    Ok(GgufCheckpoint {
        path: path.to_path_buf(),
        config,
        tensors,
    })
}

/// One tensor as loaded.
enum Loaded {
    /// A float array in MLX's dimension order.
    Dense(Array),
    /// MLX's affine layout, group size 32 (`gguf_affine`).
    Affine {
        weight: Array,
        scales: Array,
        biases: Array,
        bits: i32,
    },
}

impl Loaded {
    /// The float array; an affine one is refused (a bias never is one).
    fn dense(self, path: &Path) -> Result<Array, ModelError> {
        match self {
            Loaded::Dense(a) => Ok(a),
            Loaded::Affine { .. } => Err(bad(path, "a quantized tensor where a float one belongs")),
        }
    }
}

/// Whether a tensor of type `ty` keeps its form under `policy`: float16
/// and bfloat16 as stored, quantized types in MLX's affine layout where it
/// holds them exactly; `false` means float32.
fn kept(ty: GgmlType, policy: DtypePolicy) -> bool {
    policy == DtypePolicy::Keep
        && (matches!(ty, GgmlType::F16 | GgmlType::BF16) || gguf_affine::bits(ty).is_some())
}

/// Bytes a tensor of `elements` values of type `ty` takes once loaded under
/// `policy`: float32 unless kept ([`kept`]); kept, its float as stored, or
/// per group of 32 the packed values with a float32 scale and bias.
pub fn loaded_bytes(ty: GgmlType, elements: u64, policy: DtypePolicy) -> u64 {
    if !kept(ty, policy) {
        return 4 * elements;
    }
    match gguf_affine::bits(ty) {
        Some(bits) => elements * bits as u64 / 8 + elements / 32 * 8,
        _ => 2 * elements,
    }
}

/// Reads tensors' bytes from the file at the offsets its checked header
/// gives.
struct TensorReader<'a> {
    file: File,
    path: &'a Path,
    data_offset: u64,
}

impl<'a> TensorReader<'a> {
    fn open(path: &'a Path, summary: &GgufSummary) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            file,
            path,
            data_offset: summary.data_offset,
        })
    }

    fn bytes(&mut self, tensor: &GgufTensor) -> Result<Vec<u8>, ModelError> {
        let io = |source| ModelError::Io {
            path: self.path.to_path_buf(),
            source,
        };
        self.file
            .seek(SeekFrom::Start(self.data_offset + tensor.offset))
            .map_err(io)?;
        let mut data = vec![0_u8; tensor.byte_len as usize];
        self.file.read_exact(&mut data).map_err(io)?;
        Ok(data)
    }

    fn refused(&self, tensor: &GgufTensor) -> ModelError {
        bad(
            self.path,
            format!(
                "tensor `{}` has ggml type {}, which mlx-spec does not load",
                tensor.name, tensor.ggml_type
            ),
        )
    }

    fn mismatch(&self, tensor: &GgufTensor, len: usize) -> ModelError {
        bad(
            self.path,
            format!(
                "tensor `{}`: {len} bytes do not hold {} {} values",
                tensor.name,
                tensor.shape.iter().product::<u64>(),
                tensor.ggml_type
            ),
        )
    }

    /// The values dequantized to float32 as ggml computes them.
    fn float32(&mut self, tensor: &GgufTensor) -> Result<Vec<f32>, ModelError> {
        if !gguf_dequant::supported(tensor.ggml_type) {
            return Err(self.refused(tensor));
        }
        let data = self.bytes(tensor)?;
        let count = tensor.shape.iter().product::<u64>() as usize;
        gguf_dequant::dequantize(tensor.ggml_type, &data, count)
            .ok_or_else(|| self.mismatch(tensor, data.len()))
    }

    /// The tensor as `policy` loads it (`quantized`: whether it may stay
    /// quantized), in MLX's dimension order (ggml's reversed).
    fn load(
        &mut self,
        tensor: &GgufTensor,
        policy: DtypePolicy,
        quantized: bool,
    ) -> Result<Loaded, ModelError> {
        let ty = tensor.ggml_type;
        let shape: Vec<i32> = tensor.shape.iter().rev().map(|&d| d as i32).collect();
        if !kept(ty, policy) || (!quantized && gguf_affine::bits(ty).is_some()) {
            let values = self.float32(tensor)?;
            return Ok(Loaded::Dense(Array::from_slice(&values, &shape)));
        }
        let data = self.bytes(tensor)?;
        let halves = || data.chunks_exact(2).map(|c| [c[0], c[1]]);
        match ty {
            GgmlType::F16 => {
                let v: Vec<f16> = halves().map(f16::from_le_bytes).collect();
                return Ok(Loaded::Dense(Array::from_slice(&v, &shape)));
            }
            GgmlType::BF16 => {
                let v: Vec<bf16> = halves().map(bf16::from_le_bytes).collect();
                return Ok(Loaded::Dense(Array::from_slice(&v, &shape)));
            }
            _ => {}
        }
        let count = tensor.shape.iter().product::<u64>() as usize;
        let affine = gguf_affine::repack(ty, &data, count)
            .ok_or_else(|| self.mismatch(tensor, data.len()))?;
        let last = shape.len() - 1;
        let mut packed = shape.clone();
        packed[last] = shape[last] / 32 * affine.bits;
        let mut grouped = shape.clone();
        grouped[last] = shape[last] / 32;
        let scales = Array::from_slice(&affine.scales, &grouped);
        let biases = Array::from_slice(&affine.biases, &grouped);
        Ok(Loaded::Affine {
            weight: Array::from_slice(&affine.words, &packed),
            scales,
            biases,
            bits: affine.bits,
        })
    }
}

/// One tensor's data read from the file and dequantized to float32 as ggml
/// does, in MLX's dimension order (ggml's reversed). `summary` is the file's
/// checked header (`weights_guard::check_gguf`).
pub fn dequantized_tensor(
    path: &Path,
    summary: &GgufSummary,
    tensor: &GgufTensor,
) -> Result<Array, ModelError> {
    let values = TensorReader::open(path, summary)?.float32(tensor)?;
    let shape: Vec<i32> = tensor.shape.iter().rev().map(|&d| d as i32).collect();
    Ok(Array::from_slice(&values, &shape))
}

/// Writes the GGUF checkpoint as an mlx-lm / Hugging Face directory
/// (`config.json` + `model.safetensors`), e.g. for mlx-lm to run the same
/// weights.
pub fn convert_to_dir(path: &Path, out: &Path, policy: DtypePolicy) -> Result<(), ModelError> {
    let checkpoint = read(path, policy)?;
    std::fs::create_dir_all(out).map_err(|source| ModelError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let config_path = out.join("config.json");
    let text = serde_json::to_string_pretty(&checkpoint.config)
        .map_err(|e| ModelError::config_parse(&config_path, "", e))?;
    std::fs::write(&config_path, text).map_err(|source| ModelError::Io {
        path: config_path,
        source,
    })?;
    let weights_path = out.join("model.safetensors");
    let metadata = std::collections::HashMap::from([("format".to_owned(), "mlx".to_owned())]);
    Array::save_safetensors(&checkpoint.tensors, &metadata, &weights_path)
        .map_err(|e| checked(&weights_path, "writing: ", e))
}
