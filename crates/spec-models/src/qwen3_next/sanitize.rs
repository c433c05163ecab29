//! What mlx-lm 0.32.2's `qwen3_5` `Model.sanitize` and `TextModel.sanitize`
//! do to a checkpoint before loading, done here on our weight store: the
//! vision tower and the MTP head dropped (mlx-lm drops `mtp.*`; an MTP
//! provider will read them), every name moved under `language_model.` (a
//! multimodal `model.language_model.` prefix becomes
//! `language_model.model.`), a tied head's copy dropped, and for a Hugging
//! Face checkpoint (its depthwise conv weights `[channels, 1, kernel]`) the
//! conv weights turned to MLX's layout and the zero-centred RMS norm scales
//! shifted by one; a `qwen3_5_moe` checkpoint's fused `experts.gate_up_proj`
//! split into the switch layout. And what `qwen3_next`'s `Model.sanitize`
//! does to a Hugging Face checkpoint with expert layers (per-expert tensors
//! stacked, MTP dropped, conv layout, norms shifted); it leaves any other
//! checkpoint as it is.

use mlx_rs::ops::{split_at_indices, stack};
use mlx_rs::Array;

use super::config::{Config, Mixer};
use crate::weights::Weights;
use crate::ModelError;

/// The text model's module path in mlx-lm (`Model.language_model.model`).
pub(super) const ROOT: &str = "language_model.model";
/// The head's module path (`Model.language_model.lm_head`).
pub(super) const HEAD: &str = "language_model.lm_head";

/// Rewrites `w` as mlx-lm's sanitize does (see the module docs).
pub(super) fn qwen3_5(w: &mut Weights, c: &Config) -> Result<(), ModelError> {
    w.discard_where(|n| {
        n.starts_with("vision_tower") || n.starts_with("model.visual") || n.contains("mtp.")
    });
    w.rename(|n| match n.strip_prefix("model.language_model") {
        Some(rest) => format!("{ROOT}{rest}"),
        None if n.starts_with("language_model.") => n.to_owned(),
        None => format!("language_model.{n}"),
    })?;
    if c.tied {
        w.discard_where(|n| n.starts_with(&format!("{HEAD}.")));
    }
    for i in 0..c.mixers.len() {
        let mlp = format!("{ROOT}.layers.{i}.mlp");
        let fused = format!("{mlp}.experts.gate_up_proj");
        if !w.contains(&fused) {
            continue;
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
    }
    let hugging_face = conv_layout(w, c, ROOT)?;
    if hugging_face {
        shift_norms(w, c, ROOT)?;
    }
    Ok(())
}

/// `qwen3_next`'s sanitize: only a checkpoint with per-expert tensors
/// (Hugging Face's layout of the expert layers) is rewritten.
pub(super) fn qwen3_next(w: &mut Weights, c: &Config) -> Result<(), ModelError> {
    let Some(moe) = c.moe else {
        return Ok(());
    };
    let root = "model";
    let expert =
        |i: usize, e: i32, n: &str| format!("{root}.layers.{i}.mlp.experts.{e}.{n}.weight");
    let layers: Vec<usize> = (0..c.mixers.len())
        .filter(|&i| w.contains(&expert(i, 0, "up_proj")))
        .collect();
    if layers.is_empty() {
        return Ok(());
    }
    w.discard_where(|n| n.contains("mtp."));
    for i in layers {
        for n in ["up_proj", "down_proj", "gate_proj"] {
            let parts = (0..moe.experts)
                .map(|e| w.take(&expert(i, e, n)))
                .collect::<Result<Vec<_>, _>>()?;
            w.insert(
                format!("{root}.layers.{i}.mlp.switch_mlp.{n}.weight"),
                stack(&parts, 0)?,
            );
        }
    }
    conv_layout(w, c, root)?;
    shift_norms(w, c, root)
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

/// Shifts the zero-centred RMS norm scales by one (`v + 1.0`).
fn shift_norms(w: &mut Weights, c: &Config, root: &str) -> Result<(), ModelError> {
    let mut norms = vec![format!("{root}.norm.weight")];
    for (i, mixer) in c.mixers.iter().enumerate() {
        let l = format!("{root}.layers.{i}");
        norms.push(format!("{l}.input_layernorm.weight"));
        norms.push(format!("{l}.post_attention_layernorm.weight"));
        if *mixer == Mixer::Full {
            norms.push(format!("{l}.self_attn.q_norm.weight"));
            norms.push(format!("{l}.self_attn.k_norm.weight"));
        }
    }
    for name in norms {
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
