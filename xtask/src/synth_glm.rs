//! The gates' synthetic `glm_moe_dsa` (GLM-5.x) checkpoints on disk: the
//! float GLM-5-schema one (`spec_fixtures::glm::Glm::gate()`, MTP row
//! included) with quantized copies (4-bit group 64, 8-bit group 32), and the
//! GLM-5.2-schema one (`Glm::glm52_gate()`: IndexShare, the MTP row's
//! indexer) with a 4-bit copy; the copies come from `quantize_synth.py`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use spec_fixtures::glm::Glm;

use crate::synth::{
    is_current, models_dir, quantized_copy, replace_dir, Checkpoint, GENERATOR_VERSION, SEED,
};

/// Bump when anything below changes what gets written.
const GLM_VERSION: u32 = 2;

/// Every GLM gate model's name starts with this.
pub const NAME: &str = "glm";

/// Makes an mlx-lm quantization block.
type Block = fn() -> Value;

fn q4g64() -> Value {
    json!({"group_size": 64, "bits": 4, "mode": "affine"})
}

/// GLM-5.2 as the MLX community ships it (mxfp4), with the MTP row's
/// experts at 8 bits (`mxfp8`), as `docs/GLM.md` advises for drafting.
fn glm52_mxfp4() -> Value {
    let mtp = Glm::glm52_gate().layers;
    let mut block = json!({"group_size": 32, "bits": 4, "mode": "mxfp4"});
    for m in ["gate_proj", "up_proj", "down_proj"] {
        block[format!("model.layers.{mtp}.mlp.switch_mlp.{m}")] =
            json!({"group_size": 32, "bits": 8, "mode": "mxfp8"});
    }
    block
}

/// The float checkpoints and their quantized copies (name, block).
fn specs() -> [(Glm, &'static [(&'static str, Block)]); 2] {
    [
        (
            Glm::gate(),
            &[
                ("glm-q4g64", q4g64),
                (
                    "glm-q8g32",
                    || json!({"group_size": 32, "bits": 8, "mode": "affine"}),
                ),
            ],
        ),
        (
            Glm::glm52_gate(),
            &[("glm52-q4g64", q4g64), ("glm52-mxfp4", glm52_mxfp4)],
        ),
    ]
}

/// Whether mlx-lm 0.32.2 implements the gate model `name`: it has no
/// IndexShare, so the GLM-5.2-schema models stay out of the gates that run
/// mlx-lm on them (`parity`, `quantize`); the `reference` gate compares them
/// with transformers.
pub fn mlx_lm_implements(name: &str) -> bool {
    !name.starts_with("glm52")
}

fn float_stamp(spec: &Glm) -> String {
    format!(
        "generator {GENERATOR_VERSION} glm {GLM_VERSION}\nseed {SEED:#x}\n{}\n",
        spec.config()
    )
}

/// Makes sure the GLM checkpoints exist and are current.
pub fn ensure(python: &Path) -> Result<Vec<Checkpoint>> {
    let base = models_dir();
    let mut out = Vec::new();
    for (spec, quantized) in specs() {
        let dir = base.join(spec.name);
        let stamp = float_stamp(&spec);
        if !is_current(&dir, &stamp) {
            eprintln!("generating synthetic checkpoint {}", dir.display());
            replace_dir(&dir, &stamp, |tmp| Ok(spec.write(tmp)?))?;
        }
        out.push(Checkpoint {
            name: spec.name.to_owned(),
            dir: dir.clone(),
        });
        for (name, block) in quantized {
            let qdir = base.join(name);
            quantized_copy(python, &dir, &stamp, &qdir, &block())?;
            out.push(Checkpoint {
                name: (*name).to_owned(),
                dir: qdir,
            });
        }
    }
    Ok(out)
}

/// A GLM checkpoint's routed experts, as stored (what a streamed load
/// leaves on disk; the MTP row's are not counted: they stay resident).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutedExperts {
    /// Bytes of every target layer's routed experts.
    pub bytes: u64,
    /// Target layers holding routed experts.
    pub layers: u64,
}

impl RoutedExperts {
    /// One layer's routed experts (every expert layer holds the same).
    pub fn layer_bytes(&self) -> u64 {
        self.bytes / self.layers.max(1)
    }
}

/// Reads the routed experts' sizes of the GLM checkpoint `dir` from its
/// shards' safetensors headers (no tensor data read): tensors under
/// `model.layers.{i}.mlp.switch_mlp.` or `.mlp.experts.` with `i` below
/// `num_hidden_layers`.
pub fn routed_experts(dir: &Path) -> Result<RoutedExperts> {
    let config_path = dir.join("config.json");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?,
    )
    .with_context(|| format!("parsing {}", config_path.display()))?;
    let target_layers = config["num_hidden_layers"]
        .as_u64()
        .with_context(|| format!("{}: no num_hidden_layers", config_path.display()))?;
    let mut bytes = 0;
    let mut layers = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        for (name, (start, end)) in safetensors_extents(&path)? {
            let Some(rest) = name.strip_prefix("model.layers.") else {
                continue;
            };
            let Some((layer, module)) = rest.split_once('.') else {
                continue;
            };
            let Ok(layer) = layer.parse::<u64>() else {
                continue;
            };
            let routed =
                module.starts_with("mlp.switch_mlp.") || module.starts_with("mlp.experts.");
            if routed && layer < target_layers {
                bytes += end - start;
                layers.insert(layer);
            }
        }
    }
    if layers.is_empty() {
        bail!("{}: no routed experts", dir.display());
    }
    Ok(RoutedExperts {
        bytes,
        layers: layers.len() as u64,
    })
}

/// Each tensor of the safetensors file `path` with its data offsets, from
/// the header alone.
pub(crate) fn safetensors_extents(path: &Path) -> Result<Vec<(String, (u64, u64))>> {
    use std::io::Read;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .with_context(|| format!("{}: no header length", path.display()))?;
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    file.read_exact(&mut header)
        .with_context(|| format!("{}: truncated header", path.display()))?;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&header)
        .with_context(|| format!("{}: the header is not JSON", path.display()))?;
    let mut out = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let offsets = info["data_offsets"]
            .as_array()
            .and_then(|o| Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?)));
        let offsets =
            offsets.with_context(|| format!("{}: {name} has no data_offsets", path.display()))?;
        out.push((name, offsets));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate `glm`'s routed experts from its headers: 2 expert layers of
    /// 8 float32 experts of 3 x 64 x 64 (the MTP row's and the shared
    /// experts left out); its 4-bit copy would count packed bytes the same way.
    #[test]
    fn routed_experts_counts_the_target_layers_expert_tensors() {
        let dir = std::env::temp_dir().join(format!("xtask-routed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let spec = Glm::gate();
        spec.write(&dir).expect("checkpoint");
        let got = routed_experts(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let moe_layers = (spec.layers - spec.first_dense) as u64;
        let layer = (spec.experts * 3 * spec.moe_intermediate * spec.hidden * 4) as u64;
        assert_eq!(
            got.expect("read"),
            RoutedExperts {
                bytes: moe_layers * layer,
                layers: moe_layers,
            }
        );
    }
}
