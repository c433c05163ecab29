//! What mlx-lm's `sanitize` does to a checkpoint before `mlx_lm.convert`
//! quantizes it, where the quantized copy's names depend on it: a
//! `qwen3_moe` checkpoint's Hugging Face per-expert tensors stacked into
//! the switch layout (the layout mlx-lm saves and both loaders read).
//! Every other checkpoint is quantized as stored.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_rs::Array;
use serde_json::{Map, Value};
use spec_runtime::switch_glu::{per_expert_names, stacked_name, PROJECTIONS};

use super::QuantizeError;
use crate::ModelError;

/// The marker of a Hugging Face expert block: expert 0's first projection.
const MARKER: &str = ".experts.0.up_proj.weight";

/// `tensors` (sorted by name) as mlx-lm's sanitize leaves them for a
/// `model_type` checkpoint whose config is `config`, still sorted.
pub(crate) fn sanitize(
    src: &Path,
    model_type: &str,
    config: &Map<String, Value>,
    tensors: Vec<(String, Array)>,
) -> Result<Vec<(String, Array)>, QuantizeError> {
    let blocks: Vec<String> = tensors
        .iter()
        .filter_map(|(n, _)| n.strip_suffix(MARKER))
        .filter(|mlp| mlp.ends_with(".mlp"))
        .map(str::to_owned)
        .collect();
    if model_type != "qwen3_moe" || blocks.is_empty() {
        return Ok(tensors);
    }
    let bad = |message: String| ModelError::WeightsFile {
        path: src.to_path_buf(),
        message,
    };
    let experts = config
        .get("num_experts")
        .and_then(Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            bad("per-expert tensors but no positive `num_experts` in config.json".into())
        })?;
    let mut by_name: BTreeMap<String, Array> = tensors.into_iter().collect();
    for mlp in &blocks {
        for proj in PROJECTIONS {
            let parts = per_expert_names(mlp, proj, experts)
                .iter()
                .map(|n| {
                    by_name
                        .remove(n)
                        .ok_or_else(|| bad(format!("`{n}` is missing ({experts} experts)")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let stacked = mlx_rs::ops::stack(&parts, 0)?;
            by_name.insert(stacked_name(mlp, proj), stacked);
        }
        let extra = format!("{mlp}.experts.{experts}.");
        if let Some(n) = by_name.keys().find(|n| n.starts_with(&extra)) {
            return Err(bad(format!("`{n}` is past the config's {experts} experts")).into());
        }
    }
    Ok(by_name.into_iter().collect())
}
