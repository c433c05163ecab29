//! What mlx-lm 0.32.2's `gpt_oss` `Model.sanitize` does to a checkpoint as
//! OpenAI ships it (Hugging Face's layout): each layer's fused expert
//! projection `gate_up_proj`, whose rows alternate gate and up, split into
//! `gate_proj` and `up_proj`; its MX blocks (`*_blocks`, bytes
//! `[.., groups, 16]`) read as MLX's packed words (`[.., groups * 4]`) and
//! their scales (`*_scales`) renamed; the biases (`*_bias`) moved under
//! their projections. A checkpoint in mlx-lm's layout is left as it is.

use mlx_rs::ops::indexing::{Ellipsis, IndexOp, IntoStrideBy};
use mlx_rs::Array;

use crate::weights::Weights;
use crate::ModelError;

/// Rewrites the expert blocks of `layers` layers of `w` (see the module
/// docs); layers not held (another pipeline rank's) are skipped. With
/// `streamed` experts, OpenAI's layout is refused: the store reads
/// experts from the files as they lie.
pub(super) fn sanitize(w: &Weights, layers: usize, streamed: bool) -> Result<(), ModelError> {
    for i in 0..layers {
        let p = format!("model.layers.{i}.mlp.experts");
        let name = |leaf: &str| format!("{p}.{leaf}");
        if w.contains(&name("gate_up_proj")) {
            // mlx-lm's sanitize slices such a tensor along the wrong axis.
            return Err(ModelError::WeightsFile {
                path: name("gate_up_proj").into(),
                message: "a float `gate_up_proj` (Hugging Face's unquantized gpt-oss layout) \
                          is not read; use the MX checkpoint or an mlx-lm conversion"
                    .into(),
            });
        }
        if !w.contains(&name("gate_up_proj_blocks")) {
            continue;
        }
        if streamed {
            // Streamed experts are read from the files as they lie: one
            // expert's gate and up rows interleave in OpenAI's layout.
            return Err(ModelError::LoadOption {
                option: spec_runtime::experts::TIER_OPTION,
                message: format!(
                    "`{}` holds OpenAI's layout (gate and up rows interleaved in \
                     `gate_up_proj_blocks`), which does not stream; convert the model to \
                     mlx-lm's `gate_proj` / `up_proj` / `down_proj` first (mlx_lm.convert)",
                    name("gate_up_proj_blocks")
                ),
            });
        }
        let words = |leaf: &str| -> Result<Array, ModelError> {
            Ok(w.take(&name(leaf))?.view::<u32>()?.flatten(-2, -1)?)
        };
        // Rows alternate: gate, up, gate, up, ...
        let rows = |a: &Array, from: i32| a.index((Ellipsis, (from..).stride_by(2), ..));
        let columns = |a: &Array, from: i32| a.index((Ellipsis, (from..).stride_by(2)));
        let gate_up = words("gate_up_proj_blocks")?;
        let scales = w.take(&name("gate_up_proj_scales"))?;
        let bias = w.take(&name("gate_up_proj_bias"))?;
        for (proj, from) in [("gate_proj", 0), ("up_proj", 1)] {
            w.insert(name(&format!("{proj}.weight")), rows(&gate_up, from));
            w.insert(name(&format!("{proj}.scales")), rows(&scales, from));
            w.insert(name(&format!("{proj}.bias")), columns(&bias, from));
        }
        w.insert(name("down_proj.weight"), words("down_proj_blocks")?);
        w.insert(name("down_proj.scales"), w.take(&name("down_proj_scales"))?);
        w.insert(name("down_proj.bias"), w.take(&name("down_proj_bias"))?);
    }
    Ok(())
}
