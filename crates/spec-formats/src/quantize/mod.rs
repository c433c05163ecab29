//! Quantizing a model directory into mlx-lm's saved format, so that
//! `mlx_lm.utils.load` and our loader read it like the output of
//! `mlx_lm.convert -q`.
//!
//! Input: a safetensors checkpoint (single or sharded) with `config.json`.
//! Output: a new directory with the quantized shards (`model.safetensors` or
//! `model-0000i-of-0000n.safetensors`, at most 5 GiB each), the index file,
//! `config.json` with the `quantization` block (and its `quantization_config`
//! copy) and every other file of the source (tokenizer, generation config).
//!
//! Which tensors: mlx-lm's rule (see [`ModuleChoice`]): every
//! 2-D floating `*.weight` (a Linear or Embedding), and every 3-D expert
//! stack under a `switch_*` container (SwitchLinear), whose last dimension
//! divides by the group size, then the caller's predicate (or the model
//! family's, as mlx-lm's model files declare one). Each becomes the
//! `weight` (uint32, packed), `scales` and (affine mode) `biases` of MLX's
//! quantize op in the chosen mode (`mlx_ext::quant`, the op `mx.quantize`
//! runs), so the bits are mlx-lm's. Every mode of MLX 0.32.2 is offered
//! (`affine`, `mxfp4`, `nvfp4`, `mxfp8`); the config's block records it, and
//! the default group size and bits follow the mode as mlx-lm's do. Tensors are quantized in the file's dtype: `mlx_lm.convert`
//! first casts to the config's `torch_dtype`, which for a checkpoint stored
//! in that dtype (the usual case) changes nothing.
//!
//! `drafter` holds the drafter policy on top of this (`quantize-drafter`);
//! the drafter crates name their formats.

pub mod drafter;
mod error;
mod plan;
pub(crate) mod sanitize;
mod writer;

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

pub use error::QuantizeError;
pub use plan::{check_params, model_predicate, ModuleChoice, ModulePredicate};

use mlx_ext::quant::Packed;

use crate::config::QuantParams;
use crate::weights::{load_file, weight_files};
use plan::Decision;
use spec_runtime::ProgressFn;
pub(crate) use writer::ShardWriter;
use writer::INDEX;

/// mlx-lm's shard size limit (`MAX_FILE_SIZE_GB`, 5 GiB).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5 << 30;

/// Files of the source that are weights in other formats: never copied.
const OTHER_WEIGHT_EXTENSIONS: &[&str] = &[
    "bin",
    "pt",
    "pth",
    "ckpt",
    "gguf",
    "h5",
    "msgpack",
    "npz",
    "safetensors",
];

/// How to quantize.
#[derive(Clone)]
pub struct QuantizeOptions {
    /// Default mode, bits and group size (the `quantization` block's top level).
    pub params: QuantParams,
    /// Per-module choices; `None` uses the model family's rule, if any.
    pub predicate: Option<ModulePredicate>,
    /// Called after each source tensor: `(tensors done, tensors in all)`.
    pub progress: Option<ProgressFn>,
    /// Shard size limit in bytes.
    pub max_shard_bytes: u64,
}

impl QuantizeOptions {
    /// `params` for every module, mlx-lm's shard limit.
    pub fn new(params: QuantParams) -> Self {
        Self {
            params,
            predicate: None,
            progress: None,
            max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
        }
    }
}

impl std::fmt::Debug for QuantizeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantizeOptions")
            .field("params", &self.params)
            .field("predicate", &self.predicate.is_some())
            .field("progress", &self.progress.is_some())
            .field("max_shard_bytes", &self.max_shard_bytes)
            .finish()
    }
}

/// What a quantization run wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeReport {
    /// Module paths quantized (sorted).
    pub quantized: Vec<String>,
    /// Module paths the predicate kept full precision (recorded `false`).
    pub excluded: Vec<String>,
    /// Tensors copied unchanged (norms, biases, weights the rule skips).
    pub kept: usize,
    /// Shard files written.
    pub shards: usize,
    /// Bytes of all tensors written (the index's `total_size`).
    pub total_size: u64,
    /// Parameters of the unquantized model, counted as mlx-lm counts them
    /// (leaf modules only): the index's `total_parameters`.
    pub total_parameters: u64,
    /// Other files copied from the source (sorted names).
    pub copied: Vec<String>,
}

/// Quantizes the checkpoint at `src` into the new directory `out` (which
/// must not exist). The output appears only once complete: it is written
/// beside `out` under a temporary name and renamed at the end.
pub fn quantize_dir(
    src: &Path,
    out: &Path,
    options: &QuantizeOptions,
) -> Result<QuantizeReport, QuantizeError> {
    let _span =
        tracing::info_span!("quantize_dir", src = %src.display(), out = %out.display()).entered();
    check_params("model", options.params)?;
    let (config_path, config) = read_config_object(src)?;
    refuse_quantized_config(src, &config)?;
    if out.exists() {
        return Err(QuantizeError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    let tensors = read_tensors(src)?;
    if let Some((name, _)) = tensors.iter().find(|(n, _)| n.ends_with(".scales")) {
        return Err(QuantizeError::AlreadyQuantized {
            path: src.to_path_buf(),
            reason: format!("it holds `{name}`"),
        });
    }
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let tensors = sanitize::sanitize(src, &model_type, &config, tensors)?;
    let predicate = options
        .predicate
        .clone()
        .or_else(|| model_predicate(&model_type));

    let report = write_into_place(out, |partial| {
        write_all(
            src,
            partial,
            config,
            tensors,
            predicate.as_ref(),
            &model_type,
            options,
        )
    })?;
    tracing::info!(
        quantized = report.quantized.len(),
        excluded = report.excluded.len(),
        shards = report.shards,
        "quantized {}",
        config_path.display()
    );
    Ok(report)
}

/// Runs `write` on a fresh temporary directory beside `out` and renames it
/// to `out` once it succeeded, so the output appears only complete; on an
/// error the temporary directory is removed (best effort).
pub(crate) fn write_into_place<R>(
    out: &Path,
    write: impl FnOnce(&Path) -> Result<R, QuantizeError>,
) -> Result<R, QuantizeError> {
    let partial = partial_dir(out)?;
    match write(&partial) {
        Ok(report) => {
            std::fs::rename(&partial, out).map_err(|source| QuantizeError::Io {
                path: out.to_path_buf(),
                source,
            })?;
            Ok(report)
        }
        Err(e) => {
            // Best effort: the error being returned matters more than a
            // leftover temporary directory.
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

fn write_all(
    src: &Path,
    dir: &Path,
    mut config: Map<String, Value>,
    tensors: Vec<(String, mlx_rs::Array)>,
    predicate: Option<&ModulePredicate>,
    model_type: &str,
    options: &QuantizeOptions,
) -> Result<QuantizeReport, QuantizeError> {
    let defaults = options.params;
    let total = tensors.len();
    let mut writer = ShardWriter::new(dir, options.max_shard_bytes);
    let mut block = Map::new();
    block.insert("group_size".into(), json!(defaults.group_size));
    block.insert("bits".into(), json!(defaults.bits));
    block.insert("mode".into(), json!(defaults.mode.as_str()));
    let counted = counted_in_total(tensors.iter().map(|(n, _)| n.as_str()));
    let (mut quantized, mut excluded, mut kept, mut total_parameters) =
        (Vec::new(), Vec::new(), 0usize, 0u64);
    for (done, (name, array)) in tensors.into_iter().enumerate() {
        if counted.contains(&name) {
            total_parameters += array.size() as u64;
        }
        match plan::decide(
            model_type,
            &name,
            array.shape(),
            array.dtype(),
            defaults,
            predicate,
        )? {
            decision @ (Decision::Keep | Decision::Exclude { .. }) => {
                if let Decision::Exclude { module } = decision {
                    block.insert(module.clone(), Value::Bool(false));
                    excluded.push(module);
                }
                array.eval()?;
                writer.push(name, array)?;
                kept += 1;
            }
            Decision::Quantize {
                module,
                params,
                custom,
                names_mode,
            } => {
                let refused = |source| QuantizeError::Quantize {
                    tensor: name.clone(),
                    source,
                };
                let packed = Packed::quantize(&array, params).map_err(refused)?;
                packed.eval().map_err(refused)?;
                drop(array);
                let (weight, scales, biases) = packed.into_parts();
                writer.push(format!("{module}.weight"), weight)?;
                writer.push(format!("{module}.scales"), scales)?;
                if let Some(biases) = biases {
                    writer.push(format!("{module}.biases"), biases)?;
                }
                if custom {
                    let mut entry = json!({"group_size": params.group_size, "bits": params.bits});
                    if names_mode {
                        entry["mode"] = json!(params.mode.as_str());
                    }
                    block.insert(module.clone(), entry);
                }
                quantized.push(module);
            }
        }
        if let Some(progress) = &options.progress {
            progress(done + 1, total);
        }
    }
    let written = writer.finish(total_parameters)?;
    config.insert("quantization".into(), Value::Object(block.clone()));
    config.insert("quantization_config".into(), Value::Object(block));
    write_json(&dir.join("config.json"), &Value::Object(config))?;
    let copied = copy_other_files(src, dir)?;
    Ok(QuantizeReport {
        quantized,
        excluded,
        kept,
        shards: written.shards,
        total_size: written.total_size,
        total_parameters,
        copied,
    })
}

/// Every tensor of the checkpoint at `src` (single or sharded), sorted by
/// name; a name in two files is an error.
pub(crate) fn read_tensors(src: &Path) -> Result<Vec<(String, mlx_rs::Array)>, QuantizeError> {
    let mut tensors = Vec::new();
    for file in weight_files(src)? {
        tensors.extend(load_file(&file)?);
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = tensors.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(crate::ModelError::WeightsFile {
            path: src.to_path_buf(),
            message: format!("tensor `{}` appears in two files", pair[0].0),
        }
        .into());
    }
    Ok(tensors)
}

/// The tensors mlx-lm's `total_parameters` counts: those of leaf modules
/// (`get_total_parameters` sums `leaf_modules()`), so a parameter held by a
/// module that also has submodules (Gemma-4's `layer_scalar`) is left out. A
/// module is a leaf here when no other tensor lives below it.
pub(crate) fn counted_in_total<'a>(
    names: impl Iterator<Item = &'a str> + Clone,
) -> std::collections::HashSet<String> {
    let owners: std::collections::BTreeSet<&str> = names
        .clone()
        .map(|n| n.rsplit_once('.').map_or("", |(m, _)| m))
        .collect();
    let is_leaf = |module: &str| {
        if module.is_empty() {
            return owners.len() == 1;
        }
        let below = format!("{module}.");
        owners
            .range(below.as_str()..)
            .next()
            .is_none_or(|next| !next.starts_with(&below))
    };
    names
        .filter(|n| is_leaf(n.rsplit_once('.').map_or("", |(m, _)| m)))
        .map(str::to_owned)
        .collect()
}

/// `dir/config.json` as a JSON object.
pub fn read_config_object(dir: &Path) -> Result<(PathBuf, Map<String, Value>), QuantizeError> {
    let (value, path): (Value, PathBuf) = crate::config::read_config(dir)?;
    match value {
        Value::Object(map) => Ok((path, map)),
        _ => Err(crate::ModelError::Config {
            path,
            message: "expected a JSON object".into(),
        }
        .into()),
    }
}

/// A config with a `quantization` (mlx-lm) or `quantization_config`
/// (Hugging Face: GPTQ, AWQ, bitsandbytes, ...) block is quantized already.
fn refuse_quantized_config(src: &Path, config: &Map<String, Value>) -> Result<(), QuantizeError> {
    for key in ["quantization", "quantization_config"] {
        if config.contains_key(key) {
            return Err(QuantizeError::AlreadyQuantized {
                path: src.to_path_buf(),
                reason: format!("its config has a `{key}` block"),
            });
        }
    }
    Ok(())
}

/// A fresh, empty temporary directory beside `out`.
fn partial_dir(out: &Path) -> Result<PathBuf, QuantizeError> {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "quantized".into());
    let partial = out.with_file_name(format!(".{name}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|source| QuantizeError::Io {
            path: partial.clone(),
            source,
        })?;
    }
    std::fs::create_dir_all(&partial).map_err(|source| QuantizeError::Io {
        path: partial.clone(),
        source,
    })?;
    Ok(partial)
}

/// Copies the source's other top-level files (tokenizer, chat template,
/// generation config, ...): not `config.json`, the index or weights.
pub(crate) fn copy_other_files(src: &Path, dst: &Path) -> Result<Vec<String>, QuantizeError> {
    let entries = std::fs::read_dir(src).map_err(|source| QuantizeError::Io {
        path: src.to_path_buf(),
        source,
    })?;
    let mut copied = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| QuantizeError::Io {
            path: src.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_weights = path
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| OTHER_WEIGHT_EXTENSIONS.contains(&x));
        if !path.is_file() || is_weights || name == "config.json" || name == INDEX {
            tracing::debug!(file = %path.display(), "not copied");
            continue;
        }
        std::fs::copy(&path, dst.join(&name)).map_err(|source| QuantizeError::Io {
            path: path.clone(),
            source,
        })?;
        copied.push(name);
    }
    copied.sort();
    Ok(copied)
}

/// Writes JSON as mlx-lm does (`json.dump(..., indent=4)`; keys sorted).
pub(crate) fn write_json(path: &Path, value: &Value) -> Result<(), QuantizeError> {
    let mut bytes = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut bytes, formatter);
    serde::Serialize::serialize(value, &mut ser).map_err(|e| QuantizeError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, bytes).map_err(|source| QuantizeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::counted_in_total;

    #[test]
    fn total_parameters_counts_leaf_modules_only_as_mlx_lm_does() {
        let names = [
            "model.embed_tokens.weight",
            "model.layers.0.layer_scalar",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.up_proj.bias",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0-extra.weight",
            "model.norm.weight",
            "lm_head.weight",
        ];
        let mut counted: Vec<String> = counted_in_total(names.iter().copied())
            .into_iter()
            .collect();
        counted.sort_unstable();
        let mut expected: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| *n != "model.layers.0.layer_scalar")
            .collect();
        expected.sort_unstable();
        assert_eq!(counted, expected);
        let lone: Vec<String> = counted_in_total(["scale"].into_iter())
            .into_iter()
            .collect();
        assert_eq!(lone, ["scale"]);
    }
}
