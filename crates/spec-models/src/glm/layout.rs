//! Hugging Face layout -> mlx-lm layout, for the tensors where the two
//! differ (float weights only): per-expert MLPs (`mlp.experts.{e}.*`) are
//! stacked into `mlp.switch_mlp.*`, and the fused `self_attn.kv_b_proj` is
//! split into `embed_q` (key part, transposed per head) and `unembed_out`
//! (value part), the data movement mlx-lm's `sanitize` does. mlx-lm never
//! applies it to the MTP row (it drops it), so an MTP row copied from a
//! Hugging Face checkpoint into an mlx-lm directory arrives in this layout.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::stack;
use spec_core::SpecError;

use super::config::Config;
use crate::weights::Weights;
use crate::ModelError;

/// Rewrites layer `index`'s tensors into mlx-lm's layout where they are in
/// Hugging Face's.
pub(super) fn to_mlx_layout(w: &mut Weights, index: usize, c: &Config) -> Result<(), ModelError> {
    let p = format!("model.layers.{index}");
    let unsupported = |what: &str| {
        ModelError::Spec(SpecError::Invalid(format!(
            "{p}: quantized Hugging Face `{what}` is not supported (use float weights)"
        )))
    };
    let kv_b = format!("{p}.self_attn.kv_b_proj");
    if w.contains(&format!("{kv_b}.weight")) {
        if w.contains(&format!("{kv_b}.scales")) {
            return Err(unsupported("kv_b_proj"));
        }
        let fused = w.take_shaped(
            &format!("{kv_b}.weight"),
            &[c.heads * (c.qk_nope + c.v_head), c.kv_lora_rank],
        )?;
        let per_head = fused.reshape(&[c.heads, c.qk_nope + c.v_head, c.kv_lora_rank])?;
        let embed_q = per_head
            .index((.., ..c.qk_nope, ..))
            .swap_axes(-1, -2)?
            .contiguous()?;
        let unembed_out = per_head.index((.., c.qk_nope.., ..)).contiguous()?;
        w.insert(format!("{p}.self_attn.embed_q.weight"), embed_q);
        w.insert(format!("{p}.self_attn.unembed_out.weight"), unembed_out);
    }
    let Some(moe) = &c.moe else { return Ok(()) };
    for m in ["gate_proj", "up_proj", "down_proj"] {
        let first = format!("{p}.mlp.experts.0.{m}");
        if !w.contains(&format!("{first}.weight")) {
            continue;
        }
        if w.contains(&format!("{first}.scales")) {
            return Err(unsupported("mlp.experts"));
        }
        let experts = (0..moe.experts)
            .map(|e| w.take(&format!("{p}.mlp.experts.{e}.{m}.weight")))
            .collect::<Result<Vec<_>, _>>()?;
        w.insert(
            format!("{p}.mlp.switch_mlp.{m}.weight"),
            stack(&experts, 0)?,
        );
    }
    Ok(())
}
