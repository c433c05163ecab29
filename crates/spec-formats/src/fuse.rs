//! Fusing a fine-tuned adapter into its base model (`mlx-spec fuse`), as
//! `mlx_lm.fuse` does: a new checkpoint whose linear layers carry their
//! updates, loadable without `--adapter-path` by us and by mlx-lm.
//!
//! - LoRA and DoRA (`spec_runtime::adapter::fused_linear`) and LoRA on
//!   stacked experts (`fused_switch`): each module the adapter names gets
//!   its merged weight; a module stored quantized is dequantized first and
//!   quantized again with its own parameters (mlx-lm's `fuse` without
//!   `--dequantize`), so the bits are mlx-lm's. A module the adapter says
//!   nothing of is copied as it is (mlx-lm wraps and re-quantizes every
//!   linear layer of the adapted blocks, whose update there is zero; we
//!   keep the stored bits, which that round trip may move).
//! - `full`: each replacement tensor takes the place of the base tensor of
//!   its name, dtype and shape.
//! - `dequantize`: every quantized module is written dequantized and the
//!   config loses its `quantization` blocks.
//!
//! Tensors keep the source's names, after what mlx-lm's `sanitize` does
//! before it fuses where names depend on it (`quantize::sanitize`: a
//! `qwen3_moe` checkpoint's per-expert tensors stacked): the adapter's must
//! be the checkpoint's own module paths (mlx-lm's layout; a module it names
//! that the checkpoint does not hold is an error naming both). The output is written beside
//! `out` and renamed into place once complete; other files (tokenizer,
//! templates) are copied.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use mlx_ext::quant::Packed;
use mlx_rs::Array;
use serde_json::{Map, Value};
use spec_runtime::adapter::{fused_linear, fused_switch, Adapter};
use spec_runtime::ProgressFn;

use crate::config::{QuantParams, Quantization};
use crate::quantize::{self, QuantizeError};
use crate::ModelError;

/// How to fuse.
#[derive(Clone, Default)]
pub struct FuseOptions {
    /// Write every quantized module dequantized (`--dequantize`).
    pub dequantize: bool,
    /// Called after each source tensor: `(tensors done, tensors in all)`.
    pub progress: Option<ProgressFn>,
    /// Shard size limit in bytes (`None`: mlx-lm's 5 GiB).
    pub max_shard_bytes: Option<u64>,
}

impl std::fmt::Debug for FuseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseOptions")
            .field("dequantize", &self.dequantize)
            .field("progress", &self.progress.is_some())
            .field("max_shard_bytes", &self.max_shard_bytes)
            .finish()
    }
}

/// What a fuse wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseReport {
    /// Modules whose low-rank update was merged (sorted).
    pub fused: Vec<String>,
    /// Tensors a full fine-tune replaced (sorted).
    pub replaced: Vec<String>,
    /// Modules written dequantized that were stored quantized (sorted).
    pub dequantized: Vec<String>,
    /// Shard files written.
    pub shards: usize,
    /// Bytes of all tensors written.
    pub total_size: u64,
    /// Other files copied from the source (sorted names).
    pub copied: Vec<String>,
}

/// Fuses the adapter at `adapter` into the checkpoint at `src`, writing
/// the new directory `out` (which must not exist).
pub fn fuse_dir(
    src: &Path,
    adapter: &Path,
    out: &Path,
    options: &FuseOptions,
) -> Result<FuseReport, QuantizeError> {
    let _span = tracing::info_span!("fuse_dir", src = %src.display(), adapter = %adapter.display())
        .entered();
    let (config_path, config) = quantize::read_config_object(src)?;
    if out.exists() {
        return Err(QuantizeError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    let adapter = Adapter::load(adapter)?;
    if let Some(blocks) = block_count(&config) {
        adapter.check_blocks(blocks)?;
    }
    let quantization = Quantization::of_config(&Value::Object(config.clone()), &config_path)?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let tensors = quantize::read_tensors(src)?;
    let tensors: BTreeMap<String, Array> =
        quantize::sanitize::sanitize(src, &model_type, &config, tensors)?
            .into_iter()
            .collect();
    quantize::write_into_place(out, |partial| {
        write_fused(
            src,
            partial,
            config,
            tensors,
            adapter,
            &quantization,
            options,
        )
    })
}

/// `num_hidden_layers`, at the top or under `text_config`.
fn block_count(config: &Map<String, Value>) -> Option<usize> {
    let of = |c: &Map<String, Value>| c.get("num_hidden_layers").and_then(Value::as_u64);
    of(config)
        .or_else(|| {
            config
                .get("text_config")
                .and_then(Value::as_object)
                .and_then(of)
        })
        .and_then(|n| usize::try_from(n).ok())
}

/// A module's weight as stored: float, or packed with its parameters.
enum Stored {
    Float(Array),
    Packed(Packed),
}

/// Takes module `module`'s weight out of `tensors` (with its `scales` and
/// `biases` where quantized); `in_dim` is its unpacked input width where
/// known (the adapter's), else inferred from the config's block.
fn take_weight(
    tensors: &mut BTreeMap<String, Array>,
    module: &str,
    quantization: &Quantization,
    in_dim: Option<i32>,
) -> Result<Option<Stored>, QuantizeError> {
    let Some(weight) = tensors.remove(&format!("{module}.weight")) else {
        return Ok(None);
    };
    let Some(scales) = tensors.remove(&format!("{module}.scales")) else {
        return Ok(Some(Stored::Float(weight)));
    };
    let biases = tensors.remove(&format!("{module}.biases"));
    let columns = |a: &Array| a.shape().last().copied().unwrap_or(0);
    let params = match in_dim {
        Some(in_dim) => quantization.resolve(
            module,
            in_dim,
            columns(&weight),
            columns(&scales),
            scales.dtype(),
        )?,
        None => quantization.for_module(module),
    };
    let params: QuantParams = params.ok_or_else(|| ModelError::Quantized {
        module: module.to_owned(),
        message: "stored with scales, but the config gives it no quantization".into(),
    })?;
    let packed = Packed::from_parts(weight, scales, biases, params).map_err(|source| {
        QuantizeError::Quantize {
            tensor: format!("{module}.weight"),
            source,
        }
    })?;
    Ok(Some(Stored::Packed(packed)))
}

fn dequantized(module: &str, packed: &Packed) -> Result<Array, QuantizeError> {
    packed
        .dequantize()
        .map_err(|source| QuantizeError::Quantize {
            tensor: format!("{module}.weight"),
            source,
        })
}

/// The tensors of one module written back: quantized again with `params`
/// unless `float` holds, else float.
fn push_module(
    out: &mut BTreeMap<String, Array>,
    module: &str,
    weight: Array,
    params: Option<QuantParams>,
) -> Result<(), QuantizeError> {
    match params {
        Some(params) => {
            let packed =
                Packed::quantize(&weight, params).map_err(|source| QuantizeError::Quantize {
                    tensor: format!("{module}.weight"),
                    source,
                })?;
            let (w, scales, biases) = packed.into_parts();
            out.insert(format!("{module}.weight"), w);
            out.insert(format!("{module}.scales"), scales);
            if let Some(biases) = biases {
                out.insert(format!("{module}.biases"), biases);
            }
        }
        None => {
            out.insert(format!("{module}.weight"), weight);
        }
    }
    Ok(())
}

fn write_fused(
    src: &Path,
    dir: &Path,
    mut config: Map<String, Value>,
    mut tensors: BTreeMap<String, Array>,
    adapter: Adapter,
    quantization: &Quantization,
    options: &FuseOptions,
) -> Result<FuseReport, QuantizeError> {
    let file = adapter.file();
    let low_rank = adapter.low_rank();
    let updates = adapter.into_tensors();
    let mut written: BTreeMap<String, Array> = BTreeMap::new();
    let (mut fused, mut replaced, mut dequantized_modules) = (Vec::new(), Vec::new(), Vec::new());
    let mut quantized_bits: BTreeMap<String, i32> = BTreeMap::new();
    match low_rank {
        None => {
            for (name, array) in updates {
                let base = tensors.get(&name).ok_or_else(|| ModelError::Adapter {
                    path: file.clone(),
                    message: format!("`{name}` is not a tensor of the checkpoint"),
                })?;
                if base.shape() != array.shape() || base.dtype() != array.dtype() {
                    return Err(ModelError::Adapter {
                        path: file.clone(),
                        message: format!(
                            "`{name}` is {:?} {:?}, the checkpoint's {:?} {:?}",
                            array.dtype(),
                            array.shape(),
                            base.dtype(),
                            base.shape()
                        ),
                    }
                    .into());
                }
                tensors.insert(name.clone(), array);
                replaced.push(name);
            }
        }
        Some(settings) => {
            let modules: BTreeSet<String> = updates
                .keys()
                .filter_map(|n| n.rsplit_once('.').map(|(m, _)| m.to_owned()))
                .collect();
            for module in &modules {
                let part = |leaf: &str| updates.get(&format!("{module}.{leaf}"));
                let (Some(a), Some(b)) = (part("lora_a"), part("lora_b")) else {
                    return Err(ModelError::Adapter {
                        path: file.clone(),
                        message: format!("`{module}` needs both `lora_a` and `lora_b`"),
                    }
                    .into());
                };
                // `lora_a` is `[in, rank]`, or `[experts, rank, in]`.
                let in_dim = if a.ndim() == 3 {
                    a.shape().last().copied()
                } else {
                    a.shape().first().copied()
                };
                let stored =
                    take_weight(&mut tensors, module, quantization, in_dim)?.ok_or_else(|| {
                        ModelError::Adapter {
                            path: file.clone(),
                            message: format!(
                                "`{module}.lora_a` adapts `{module}`, but the checkpoint holds no \
                             `{module}.weight` (the adapter's names are mlx-lm's module paths; \
                             fuse takes a checkpoint in mlx-lm's layout)"
                            ),
                        }
                    })?;
                let (weight, params) = match &stored {
                    Stored::Float(w) => (w.clone(), None),
                    Stored::Packed(p) => (dequantized(module, p)?, Some(p.params())),
                };
                let merged = if weight.ndim() == 3 {
                    fused_switch(&file, module, &weight, (a, b), settings)?
                } else {
                    fused_linear(&file, module, &weight, (a, b), settings, part("m"))?
                };
                merged.eval()?;
                let params = params.filter(|_| !options.dequantize);
                if let (Stored::Packed(_), None) = (&stored, params) {
                    dequantized_modules.push(module.clone());
                }
                if let Some(p) = params {
                    quantized_bits.insert(module.clone(), p.bits);
                }
                push_module(&mut written, module, merged, params)?;
                fused.push(module.clone());
            }
        }
    }
    // Every other module: quantized ones dequantized if asked, the rest
    // as stored.
    let packed_modules: Vec<String> = tensors
        .keys()
        .filter_map(|n| n.strip_suffix(".scales").map(str::to_owned))
        .collect();
    for module in packed_modules {
        let Some(Stored::Packed(packed)) = take_weight(&mut tensors, &module, quantization, None)?
        else {
            continue;
        };
        if options.dequantize {
            let weight = dequantized(&module, &packed)?;
            weight.eval()?;
            written.insert(format!("{module}.weight"), weight);
            dequantized_modules.push(module);
        } else {
            quantized_bits.insert(module.clone(), packed.params().bits);
            let (w, scales, biases) = packed.into_parts();
            written.insert(format!("{module}.weight"), w);
            written.insert(format!("{module}.scales"), scales);
            if let Some(biases) = biases {
                written.insert(format!("{module}.biases"), biases);
            }
        }
    }
    written.append(&mut tensors);
    dequantized_modules.sort();

    let total_parameters = total_parameters(&written, &quantized_bits);
    let total = written.len();
    let mut writer = quantize::ShardWriter::new(
        dir,
        options
            .max_shard_bytes
            .unwrap_or(quantize::DEFAULT_MAX_SHARD_BYTES),
    );
    for (done, (name, array)) in written.into_iter().enumerate() {
        array.eval()?;
        writer.push(name, array)?;
        if let Some(progress) = &options.progress {
            progress(done + 1, total);
        }
    }
    let shards = writer.finish(total_parameters)?;
    if options.dequantize {
        config.remove("quantization");
        config.remove("quantization_config");
    }
    quantize::write_json(&dir.join("config.json"), &Value::Object(config))?;
    let copied = quantize::copy_other_files(src, dir)?;
    replaced.sort();
    Ok(FuseReport {
        fused,
        replaced,
        dequantized: dequantized_modules,
        shards: shards.shards,
        total_size: shards.total_size,
        copied,
    })
}

/// Parameters as mlx-lm counts them for the index (`get_total_parameters`:
/// leaf modules; a quantized one counts its unpacked weight and its bias).
fn total_parameters(
    tensors: &BTreeMap<String, Array>,
    quantized_bits: &BTreeMap<String, i32>,
) -> u64 {
    let counted = quantize::counted_in_total(tensors.keys().map(String::as_str));
    tensors
        .iter()
        .filter(|(name, _)| counted.contains(*name))
        .map(|(name, array)| {
            let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
            match (quantized_bits.get(module), leaf) {
                (Some(_), "scales" | "biases") => 0,
                (Some(&bits), "weight") => array.size() as u64 * 32 / bits as u64,
                _ => array.size() as u64,
            }
        })
        .sum()
}
