//! Hugging Face layout -> mlx-lm layout, for the tensors where the two
//! differ (float weights only): per-expert MLPs (`mlp.experts.{e}.*`, what
//! transformers' `save_pretrained` writes by default) are stacked into
//! `mlp.switch_mlp.*`; transformers' in-memory expert tensors
//! (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first, and
//! `mlp.experts.down_proj` [E, H, I], written with
//! `save_original_format=False`) are split and renamed the same way; the
//! fused `self_attn.kv_b_proj` is
//! split into `embed_q` (key part, transposed per head) and `unembed_out`
//! (value part), the data movement mlx-lm's `sanitize` does. mlx-lm never
//! applies it to the MTP row (it drops it), so an MTP row copied from a
//! Hugging Face checkpoint into an mlx-lm directory arrives in this layout.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::stack;

use super::config::Config;
use crate::weights::WeightsView;
use crate::ModelError;

/// Rewrites the tensors of the layer `vb` reads (`model.layers.{i}`) into
/// mlx-lm's layout where they are in Hugging Face's; the routed experts
/// only when `stack_experts` (streamed experts are read where they lie).
pub(super) fn to_mlx_layout(
    vb: &WeightsView<'_>,
    c: &Config,
    stack_experts: bool,
) -> Result<(), ModelError> {
    let p = vb.prefix();
    let unsupported = |what: &str| ModelError::Quantized {
        module: p.to_string(),
        message: format!("quantized Hugging Face `{what}` is not supported (use float weights)"),
    };
    let kv_b = vb.pp("self_attn.kv_b_proj");
    if kv_b.contains("weight") {
        if kv_b.contains("scales") {
            return Err(unsupported("kv_b_proj"));
        }
        let fused = kv_b.take_shaped(
            "weight",
            &[c.heads * (c.qk_nope + c.v_head), c.kv_lora_rank],
        )?;
        let per_head = fused.reshape(&[c.heads, c.qk_nope + c.v_head, c.kv_lora_rank])?;
        let embed_q = per_head
            .index((.., ..c.qk_nope, ..))
            .swap_axes(-1, -2)?
            .contiguous()?;
        let unembed_out = per_head.index((.., c.qk_nope.., ..)).contiguous()?;
        vb.insert("self_attn.embed_q.weight", embed_q);
        vb.insert("self_attn.unembed_out.weight", unembed_out);
    }
    let Some(moe) = c.moe.as_ref().filter(|_| stack_experts) else {
        return Ok(());
    };
    let experts = vb.pp("mlp.experts");
    if experts.contains("gate_up_proj") || experts.contains("down_proj") {
        if experts.contains("gate_up_proj.scales") || experts.contains("down_proj.scales") {
            return Err(unsupported("mlp.experts"));
        }
        let (e, i, h) = (moe.experts, moe.intermediate, c.hidden);
        let gate_up = experts.take_shaped("gate_up_proj", &[e, 2 * i, h])?;
        let gate = gate_up.index((.., ..i, ..)).contiguous()?;
        let up = gate_up.index((.., i.., ..)).contiguous()?;
        let down = experts.take_shaped("down_proj", &[e, h, i])?;
        vb.insert("mlp.switch_mlp.gate_proj.weight", gate);
        vb.insert("mlp.switch_mlp.up_proj.weight", up);
        vb.insert("mlp.switch_mlp.down_proj.weight", down);
        return Ok(());
    }
    for m in ["gate_proj", "up_proj", "down_proj"] {
        let first = vb.pp("mlp.experts.0").pp(m);
        if !first.contains("weight") {
            continue;
        }
        if first.contains("scales") {
            return Err(unsupported("mlp.experts"));
        }
        let experts = (0..moe.experts)
            .map(|e| vb.pp("mlp.experts").pp(e).pp(m).take("weight"))
            .collect::<Result<Vec<_>, _>>()?;
        vb.insert(&format!("mlp.switch_mlp.{m}.weight"), stack(&experts, 0)?);
    }
    Ok(())
}
