//! Llama-family checkpoints (`llama`, `qwen2`, `qwen3`, `qwen3moe`) straight from a GGUF
//! file (llama.cpp's format, read by MLX itself): tensors renamed to Hugging
//! Face names, llama.cpp's q/k row permutation undone (`llama` only: its
//! converter permutes no other family), the configuration rebuilt from the
//! metadata, and
//! quantized tensors dequantized to float32 exactly as ggml does
//! (`gguf_dequant`) or, under `DtypePolicy::Keep`, Q4_0/Q4_1/Q8_0 kept in
//! MLX's affine layout (group 32).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use mlx_rs::io::{GgufFile, GgufMetadataValue};
use mlx_rs::{Array, Dtype};

use weights_guard::{GgmlType, GgufSummary, GgufTensor};

use crate::gguf_dequant;
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
    pub tensors: HashMap<String, Array>,
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

struct Meta<'a> {
    file: &'a GgufFile,
    path: &'a Path,
}

/// A GGUF reader's error on one metadata key.
#[derive(Debug, thiserror::Error)]
#[error("metadata {key}: {source}")]
struct MetadataError {
    key: String,
    source: spec_core::error::BoxError,
}

impl Meta<'_> {
    fn metadata_error(&self, key: &str, e: impl Into<spec_core::error::BoxError>) -> ModelError {
        let error = MetadataError {
            key: key.to_owned(),
            source: e.into(),
        };
        checked(self.path, "", error)
    }

    fn number(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self
            .file
            .get_metadata(key)
            .map_err(|e| self.metadata_error(key, e))?
        {
            None => Ok(None),
            Some(GgufMetadataValue::Array(a)) if a.size() == 1 => {
                let v = a.as_dtype(Dtype::Float32)?;
                let v = v
                    .try_item_exact::<f32>()
                    .map_err(|e| self.metadata_error(key, e))?;
                Ok(Some(f64::from(v)))
            }
            Some(other) => Err(bad(
                self.path,
                format!(
                    "metadata {key}: expected a number, found {:?}",
                    other.kind()
                ),
            )),
        }
    }

    fn required(&self, key: &str) -> Result<f64, ModelError> {
        self.number(key)?
            .ok_or_else(|| bad(self.path, format!("metadata {key} is missing")))
    }

    fn string(&self, key: &str) -> Result<Option<String>, ModelError> {
        self.file
            .get_metadata_string(key)
            .map_err(|e| self.metadata_error(key, e))
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
    // Our own header validation first: MLX must never see a malformed or
    // hostile file.
    let summary = weights_guard::check_gguf(path, &weights_guard::Limits::default())
        .map_err(|e| checked(path, "", e))?;
    let types: HashMap<&str, &GgufTensor> = summary
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let file = GgufFile::load(path).map_err(|e| checked(path, "not a readable GGUF file: ", e))?;
    let meta = Meta { file: &file, path };
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

    let arrays = file
        .arrays()
        .map_err(|e| checked(path, "reading tensors: ", e))?;
    // Group the raw arrays by module: `weight` plus, when quantized, `scales`/`biases`.
    let mut modules: HashMap<String, HashMap<String, Array>> = HashMap::new();
    for (name, array) in arrays {
        let (module, part) = name
            .rsplit_once('.')
            .ok_or_else(|| bad(path, format!("tensor `{name}` has no part suffix")))?;
        modules
            .entry(module.to_owned())
            .or_default()
            .insert(part.to_owned(), array);
    }
    let mut tensors = HashMap::new();
    let mut overrides = serde_json::Map::new();
    let mut vocab = None;
    let mut has_bias = false;
    let mut rope_factors = None;
    let stored_as = |module: &str, part: &str| {
        types
            .get(format!("{module}.{part}").as_str())
            .copied()
            .ok_or_else(|| bad(path, format!("`{module}` has no {part}")))
    };
    for (module, mut parts) in modules {
        if module == "rope_freqs" {
            let factors = dequantized_tensor(path, &summary, stored_as(&module, "weight")?)?;
            rope_factors = Some(factors.as_slice::<f32>().to_vec());
            continue;
        }
        let hf = hf_module(&module).ok_or_else(|| {
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
        let stored = stored_as(&module, "weight")?;
        // A bias (`qwen2`'s q/k/v) is a float vector: loaded as a weight of
        // its type would be, never kept quantized.
        if let Some(bias) = parts.remove("bias") {
            let bias_stored = stored_as(&module, "bias")?;
            let bias = if kept_by_mlx(bias_stored.ggml_type, policy) {
                bias
            } else {
                dequantized_tensor(path, &summary, bias_stored)?
            };
            tensors.insert(format!("{hf}.bias"), fix(bias)?);
            has_bias = true;
        }
        if !kept_by_mlx(stored.ggml_type, policy) {
            // MLX's own reading of this type is not ggml's float32: ours.
            let dense = dequantized_tensor(path, &summary, stored)?;
            if hf == "model.embed_tokens" {
                vocab = Some(dense.shape()[0]);
            }
            tensors.insert(format!("{hf}.weight"), fix(dense)?);
            for part in ["weight", "scales", "biases"] {
                parts.remove(part);
            }
            if let Some(extra) = parts.keys().next() {
                return Err(bad(
                    path,
                    format!("`{module}` has an unexpected part `{extra}`"),
                ));
            }
            continue;
        }
        let weight = parts
            .remove("weight")
            .ok_or_else(|| bad(path, format!("`{module}` has no weight")))?;
        match (parts.remove("scales"), parts.remove("biases")) {
            (Some(scales), Some(biases)) => {
                let in_dim = scales.shape()[1] * 32;
                let bits = weight.shape()[1] * 32 / in_dim;
                if hf == "model.embed_tokens" {
                    vocab = Some(weight.shape()[0]);
                }
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
            (None, None) => {
                if hf == "model.embed_tokens" {
                    vocab = Some(weight.shape()[0]);
                }
                tensors.insert(format!("{hf}.weight"), fix(weight)?);
            }
            _ => {
                return Err(bad(
                    path,
                    format!("`{module}` has scales without biases or the reverse"),
                ))
            }
        }
        if let Some(extra) = parts.keys().next() {
            return Err(bad(
                path,
                format!("`{module}` has an unexpected part `{extra}`"),
            ));
        }
    }
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
        "tie_word_embeddings": !tensors.contains_key("lm_head.weight") && !tensors.contains_key("lm_head.scales"),
    });
    if let Some(experts) = experts {
        // llama.cpp's `qwen3moe`: every layer holding `ffn_gate_exps` is an
        // expert block, its top-k weights normalized (the model's
        // `norm_topk_prob`, which the converter does not record).
        let dense: Vec<usize> = (0..layers)
            .filter(|l| !types.contains_key(format!("blk.{l}.ffn_gate_exps.weight").as_str()))
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

/// Whether a tensor of this type is taken as MLX's GGUF reader gives it:
/// only under `Keep`, and only where MLX keeps ggml's values (float32 and
/// float16 as stored; Q4_0/Q4_1/Q8_0 as MLX affine blocks, whose float16
/// scales and biases the quantized kernels use as they are).
fn kept_by_mlx(ty: GgmlType, policy: DtypePolicy) -> bool {
    policy == DtypePolicy::Keep
        && matches!(
            ty,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0
        )
}

/// Bytes a tensor of `elements` values of type `ty` takes once loaded under
/// `policy`: float32 unless MLX keeps it ([`kept_by_mlx`]), and then its
/// float as stored, or per block of 32 values the packed values with a
/// float16 scale and a float16 bias (MLX gives Q4_0 and Q8_0 a bias too).
pub fn loaded_bytes(ty: GgmlType, elements: u64, policy: DtypePolicy) -> u64 {
    if !kept_by_mlx(ty, policy) {
        return 4 * elements;
    }
    match ty {
        GgmlType::F32 => 4 * elements,
        GgmlType::F16 => 2 * elements,
        GgmlType::Q8_0 => elements / 32 * (32 + 4),
        _ => elements / 32 * (16 + 4),
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
    if !gguf_dequant::supported(tensor.ggml_type) {
        return Err(bad(
            path,
            format!(
                "tensor `{}` has ggml type {}, which mlx-spec does not load",
                tensor.name, tensor.ggml_type
            ),
        ));
    }
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    file.seek(SeekFrom::Start(summary.data_offset + tensor.offset))
        .map_err(io)?;
    let mut data = vec![0_u8; tensor.byte_len as usize];
    file.read_exact(&mut data).map_err(io)?;
    let count: u64 = tensor.shape.iter().product();
    let values =
        gguf_dequant::dequantize(tensor.ggml_type, &data, count as usize).ok_or_else(|| {
            bad(
                path,
                format!(
                    "tensor `{}`: {} bytes do not hold {count} {} values",
                    tensor.name,
                    data.len(),
                    tensor.ggml_type
                ),
            )
        })?;
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
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);
    Array::save_safetensors(&checkpoint.tensors, &metadata, &weights_path)
        .map_err(|e| checked(&weights_path, "writing: ", e))
}
