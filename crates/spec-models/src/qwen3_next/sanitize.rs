//! What mlx-lm 0.32.2's `qwen3_5` `Model.sanitize` and `TextModel.sanitize`
//! do to a checkpoint before loading, done here on our weight store: the
//! vision tower dropped, every name moved under `language_model.` (a
//! multimodal `model.language_model.` prefix becomes
//! `language_model.model.`), a tied head's copy dropped, and for a Hugging
//! Face checkpoint (its depthwise conv weights `[channels, 1, kernel]`) the
//! conv weights turned to MLX's layout and the zero-centred RMS norm scales
//! shifted by one; a `qwen3_5_moe` checkpoint's fused `experts.gate_up_proj`
//! split into the switch layout. And what `qwen3_next`'s `Model.sanitize`
//! does to a Hugging Face checkpoint with expert layers (per-expert tensors
//! stacked, conv layout, norms shifted); it leaves any other checkpoint as
//! it is. mlx-lm drops the MTP head (`mtp.*`); we keep it under [`MTP`],
//! its expert block and norms rewritten as the stack's.

use mlx_rs::ops::split_at_indices;
use mlx_rs::Array;

use super::config::{Config, Mixer};
use crate::weights::Weights;
use crate::ModelError;

/// The text model's module path in mlx-lm (`Model.language_model.model`).
pub(super) const ROOT: &str = "language_model.model";
/// The head's module path (`Model.language_model.lm_head`).
pub(super) const HEAD: &str = "language_model.lm_head";
/// The MTP head's path, in every layout: the checkpoint's own.
pub(super) const MTP: &str = "mtp";
/// The MTP head's one decoder layer.
pub(super) const MTP_LAYER: &str = "mtp.layers.0";

/// Rewrites `w` as mlx-lm's sanitize does (see the module docs).
/// `streamed`: the stack's routed experts stay as the files hold them
/// (streamed experts are read from the files in either layout); the MTP
/// head's are rewritten all the same.
pub(super) fn qwen3_5(w: &mut Weights, c: &Config, streamed: bool) -> Result<(), ModelError> {
    w.discard_where(|n| n.starts_with("vision_tower") || n.starts_with("model.visual"));
    let mtp = format!("{MTP}.");
    w.rename(|n| match n.strip_prefix("model.language_model") {
        Some(rest) => format!("{ROOT}{rest}"),
        None if n.starts_with("language_model.") || n.starts_with(&mtp) => n.to_owned(),
        None => format!("language_model.{n}"),
    })?;
    if c.tied {
        w.discard_where(|n| n.starts_with(&format!("{HEAD}.")));
    }
    for i in (0..c.mixers.len()).filter(|_| !streamed) {
        split_fused_experts(w, &format!("{ROOT}.layers.{i}.mlp"))?;
    }
    split_fused_experts(w, &format!("{MTP_LAYER}.mlp"))?;
    let hugging_face = conv_layout(w, c, ROOT)?;
    if hugging_face {
        shift_norms(w, stack_norms(c, ROOT).chain(mtp_norms()))?;
    }
    Ok(())
}

/// Splits a fused `experts.gate_up_proj` under `mlp` (Hugging Face's
/// `qwen3_5_moe` layout) into the switch layout; nothing when absent.
fn split_fused_experts(w: &Weights, mlp: &str) -> Result<(), ModelError> {
    let fused = format!("{mlp}.experts.gate_up_proj");
    if !w.contains(&fused) {
        return Ok(());
    }
    let gate_up = w.take(&fused)?;
    let mid = gate_up.shape()[gate_up.ndim().saturating_sub(2)] / 2;
    let halves = split_at_indices(&gate_up, &[mid], -2)?;
    let [gate, up] = <[Array; 2]>::try_from(halves).map_err(|_| {
        ModelError::Spec(spec_core::SpecError::Internal(
            "a split in two gave another number of parts",
        ))
    })?;
    w.insert(format!("{mlp}.switch_mlp.gate_proj.weight"), gate);
    w.insert(format!("{mlp}.switch_mlp.up_proj.weight"), up);
    let down = w.take(&format!("{mlp}.experts.down_proj"))?;
    w.insert(format!("{mlp}.switch_mlp.down_proj.weight"), down);
    Ok(())
}

/// `qwen3_next`'s sanitize: only a checkpoint with per-expert tensors
/// (Hugging Face's layout of the expert layers) is rewritten (`streamed`:
/// as in [`qwen3_5`], the stack's routed experts stay as stored).
pub(super) fn qwen3_next(w: &mut Weights, c: &Config, streamed: bool) -> Result<(), ModelError> {
    let Some(moe) = c.moe else {
        return Ok(());
    };
    let root = "model";
    let per_expert = |mlp: &str| w.contains(&format!("{mlp}.experts.0.up_proj.weight"));
    let blocks: Vec<String> = (0..c.mixers.len())
        .map(|i| format!("{root}.layers.{i}.mlp"))
        .filter(|mlp| per_expert(mlp))
        .collect();
    if blocks.is_empty() {
        return Ok(());
    }
    let mtp = format!("{MTP_LAYER}.mlp");
    let stacked = blocks.iter().filter(|_| !streamed);
    for mlp in stacked.chain(per_expert(&mtp).then_some(&mtp)) {
        crate::sparse_moe::stack_per_expert(w, mlp, moe.experts)?;
    }
    conv_layout(w, c, root)?;
    shift_norms(w, stack_norms(c, root).chain(mtp_norms()))
}

/// Turns Hugging Face's depthwise conv weights (`[channels, 1, kernel]`)
/// to MLX's layout; whether any was.
fn conv_layout(w: &mut Weights, c: &Config, root: &str) -> Result<bool, ModelError> {
    let mut hugging_face = false;
    for (i, mixer) in c.mixers.iter().enumerate() {
        let name = format!("{root}.layers.{i}.linear_attn.conv1d.weight");
        if *mixer != Mixer::Linear || !w.contains(&name) {
            continue;
        }
        let t = w.take(&name)?;
        let t = if t.ndim() == 3 && t.shape()[2] != 1 {
            hugging_face = true;
            t.swap_axes(1, 2)?
        } else {
            t
        };
        w.insert(name, t);
    }
    Ok(hugging_face)
}

/// The zero-centred RMS norms of the stack under `root`.
fn stack_norms<'a>(c: &'a Config, root: &str) -> impl Iterator<Item = String> + 'a {
    let root = root.to_owned();
    std::iter::once(format!("{root}.norm.weight")).chain(c.mixers.iter().enumerate().flat_map(
        move |(i, mixer)| {
            let l = format!("{root}.layers.{i}");
            let mut names = vec![
                format!("{l}.input_layernorm.weight"),
                format!("{l}.post_attention_layernorm.weight"),
            ];
            if *mixer == Mixer::Full {
                names.push(format!("{l}.self_attn.q_norm.weight"));
                names.push(format!("{l}.self_attn.k_norm.weight"));
            }
            names
        },
    ))
}

/// The MTP head's zero-centred RMS norms (its layer is full attention).
fn mtp_norms() -> impl Iterator<Item = String> {
    [
        "pre_fc_norm_embedding",
        "pre_fc_norm_hidden",
        "norm",
        "layers.0.input_layernorm",
        "layers.0.post_attention_layernorm",
        "layers.0.self_attn.q_norm",
        "layers.0.self_attn.k_norm",
    ]
    .into_iter()
    .map(|n| format!("{MTP}.{n}.weight"))
}

/// Shifts the zero-centred RMS norm scales among `names` by one (`v +
/// 1.0`); absent names are skipped.
fn shift_norms(w: &Weights, names: impl Iterator<Item = String>) -> Result<(), ModelError> {
    for name in names {
        if !w.contains(&name) {
            continue;
        }
        let t = w.take(&name)?;
        let t = if t.ndim() == 1 {
            // `v + 1.0`: a Python scalar takes the tensor's dtype.
            t.add(Array::from_f32(1.0).as_dtype(t.dtype())?)?
        } else {
            t
        };
        w.insert(name, t);
    }
    Ok(())
}
