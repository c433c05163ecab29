//! What a checkpoint's weights take in memory under each dtype policy,
//! read from its headers alone (nothing is loaded): as stored
//! ([`DtypePolicy::Keep`]) and as float32 ([`DtypePolicy::Float32`], the
//! default, which dequantizes quantized weights and widens half ones), so
//! that a host can choose a policy that fits before it loads anything.
//!
//! Estimates, not a ledger: tensors an architecture skips at load (a vision
//! tower, an MTP row it does not run) count too, so both figures are upper
//! bounds on the weights a loaded model reports (`Target::weights_bytes`).

use std::collections::HashSet;
use std::path::Path;

use spec_runtime::config::{Quantization, QuantizationKeys};
use spec_runtime::weights::weight_files;
use weights_guard::{GgufSummary, Limits, SafetensorsSummary};

use crate::{DtypePolicy, ModelError};

/// A checkpoint's weights in bytes under each policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Under [`DtypePolicy::Keep`]: the file's own dtypes and quantization.
    pub stored: u64,
    /// Under [`DtypePolicy::Float32`].
    pub float32: u64,
}

impl Footprint {
    /// The bytes under `policy`.
    pub fn bytes(&self, policy: DtypePolicy) -> u64 {
        match policy {
            DtypePolicy::Float32 => self.float32,
            DtypePolicy::Keep => self.stored,
        }
    }
}

/// The share of the memory available that float32 weights may take for
/// [`default_policy`] to choose them: the rest is for caches, activations
/// and everything else running.
pub const FLOAT32_SHARE: f64 = 0.75;

/// The policy a host runs when its user chose none: float32 (on a CPU the
/// fast path: its matmuls go through BLAS) where those weights, beside the
/// `resident` bytes of the models loaded before, take at most
/// [`FLOAT32_SHARE`] of the memory `available` (`spec_runtime::host_memory`),
/// else the file's own dtypes and quantization. Float32 where nothing is
/// known of the memory.
pub fn default_policy(print: &Footprint, resident: u64, available: Option<u64>) -> DtypePolicy {
    match available {
        Some(a) if (resident + print.float32) as f64 > FLOAT32_SHARE * a as f64 => {
            DtypePolicy::Keep
        }
        _ => DtypePolicy::Float32,
    }
}

/// The footprint of the checkpoint at `path`: a directory in mlx-lm's
/// layout or a GGUF file, each file's header checked by `weights-guard`.
pub fn footprint(path: &Path) -> Result<Footprint, ModelError> {
    let checked = |file: &Path, e: weights_guard::GuardError| ModelError::WeightsCheck {
        path: file.to_path_buf(),
        context: "",
        source: e.into(),
    };
    if path.extension().is_some_and(|x| x == "gguf") {
        let summary =
            weights_guard::check_gguf(path, &Limits::default()).map_err(|e| checked(path, e))?;
        return Ok(gguf_footprint(&summary));
    }
    let quant = quantization(path)?;
    let mut summaries = Vec::new();
    for file in weight_files(path)? {
        summaries.push(
            weights_guard::check_safetensors(&file, &Limits::default())
                .map_err(|e| checked(&file, e))?,
        );
    }
    Ok(safetensors_footprint(&summaries, &quant))
}

/// The config's quantization block.
fn quantization(dir: &Path) -> Result<Quantization, ModelError> {
    let (keys, path): (QuantizationKeys, _) = spec_runtime::config::read_config(dir)?;
    keys.parse(&path)
}

/// A GGUF file, tensor by tensor as `spec_formats::gguf` loads it.
fn gguf_footprint(summary: &GgufSummary) -> Footprint {
    let mut f = Footprint {
        stored: 0,
        float32: 0,
    };
    for t in &summary.tensors {
        let elements = t.shape.iter().product::<u64>();
        let bytes = |policy| spec_formats::gguf::loaded_bytes(t.ggml_type, elements, policy);
        f.float32 += bytes(DtypePolicy::Float32);
        f.stored += bytes(DtypePolicy::Keep);
    }
    f
}

/// Safetensors shards: a quantized weight (`X.weight` beside `X.scales`)
/// widens to its unpacked columns in float32 and its scales and biases go;
/// every other tensor becomes float32 as it is.
fn safetensors_footprint(summaries: &[SafetensorsSummary], quant: &Quantization) -> Footprint {
    let names: HashSet<&str> = summaries
        .iter()
        .flat_map(|s| s.tensors.iter().map(|t| t.name.as_str()))
        .collect();
    fn packed_module<'n>(names: &HashSet<&str>, name: &'n str) -> Option<&'n str> {
        name.strip_suffix(".weight")
            .filter(|m| names.contains(format!("{m}.scales").as_str()))
    }
    let mut f = Footprint {
        stored: 0,
        float32: 0,
    };
    for t in summaries.iter().flat_map(|s| &s.tensors) {
        f.stored += t.byte_len();
        let elements = t.shape.iter().product::<u64>();
        let quant_part = ["scales", "biases"].iter().any(|leaf| {
            t.name
                .strip_suffix(leaf)
                .and_then(|m| m.strip_suffix('.'))
                .is_some_and(|m| names.contains(format!("{m}.weight").as_str()))
        });
        f.float32 += match packed_module(&names, &t.name) {
            // 32-bit words of `bits`-bit values; a module the block does not
            // name is read at the block's default (4 bits without one).
            Some(module) => {
                let bits = quant
                    .for_module(module)
                    .map_or(4, |p| u64::try_from(p.bits).unwrap_or(4).max(1));
                4 * (elements * t.dtype.bits() / bits)
            }
            None if quant_part => 0,
            None => 4 * elements,
        };
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch_check::quantized;
    use crate::load::load_model;
    use crate::LoadOptions;
    use spec_fixtures::llama::Llama;

    fn loaded_bytes(dir: &Path, dtype: DtypePolicy) -> u64 {
        let options = LoadOptions {
            dtype,
            ..LoadOptions::default()
        };
        load_model(dir, &options).expect("load").weights_bytes() as u64
    }

    /// Float32 and 4-bit copies of one model: each estimate equals what the
    /// loaded model holds under that policy.
    #[test]
    fn estimates_equal_the_loaded_weights() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let src = tmp.path().join("f32");
        std::fs::create_dir(&src).expect("mkdir");
        Llama::tiny(1).write(&src).expect("fixture");
        let q4 = quantized(&src, tmp.path(), |m| m.contains("norm"));

        let f32_print = footprint(&src).expect("float footprint");
        assert_eq!(f32_print.stored, f32_print.float32, "a float32 file");
        assert_eq!(f32_print.float32, loaded_bytes(&src, DtypePolicy::Float32));

        let q4_print = footprint(&q4).expect("quantized footprint");
        assert_eq!(
            q4_print.float32, f32_print.float32,
            "dequantized: the float model"
        );
        assert_eq!(q4_print.stored, loaded_bytes(&q4, DtypePolicy::Keep));
        assert_eq!(q4_print.float32, loaded_bytes(&q4, DtypePolicy::Float32));
        assert!(q4_print.stored * 4 < q4_print.float32, "{q4_print:?}");
    }

    #[test]
    fn float32_only_where_it_fits() {
        let print = Footprint {
            stored: 1_000,
            float32: 7_500,
        };
        assert_eq!(
            default_policy(&print, 0, Some(10_000)),
            DtypePolicy::Float32
        );
        assert_eq!(default_policy(&print, 0, Some(9_999)), DtypePolicy::Keep);
        assert_eq!(default_policy(&print, 0, None), DtypePolicy::Float32);
        // Beside a target already planned.
        assert_eq!(default_policy(&print, 1, Some(10_000)), DtypePolicy::Keep);
        assert_eq!(
            default_policy(&print, 1_500, Some(12_000)),
            DtypePolicy::Float32
        );
    }

    #[test]
    fn a_truncated_shard_is_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        Llama::tiny(1).write(tmp.path()).expect("fixture");
        let file = weight_files(tmp.path()).expect("files").remove(0);
        let bytes = std::fs::read(&file).expect("read");
        std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
        let err = footprint(tmp.path()).expect_err("truncated");
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{err}"
        );
    }
}
