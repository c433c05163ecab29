//! What mlx-lm 0.32.2's `qwen3_5` `Model.sanitize` and `TextModel.sanitize`
//! do to a checkpoint before loading, done here on our weight store: the
//! vision tower and the MTP head dropped (mlx-lm drops `mtp.*`; an MTP
//! provider will read them), every name moved under `language_model.` (a
//! multimodal `model.language_model.` prefix becomes
//! `language_model.model.`), a tied head's copy dropped, and for a Hugging
//! Face checkpoint (its depthwise conv weights `[channels, 1, kernel]`) the
//! conv weights turned to MLX's layout and the zero-centred RMS norm scales
//! shifted by one.

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
    let mut hugging_face = false;
    for (i, mixer) in c.mixers.iter().enumerate() {
        let name = format!("{ROOT}.layers.{i}.linear_attn.conv1d.weight");
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
    if hugging_face {
        let mut norms = vec![format!("{ROOT}.norm.weight")];
        for (i, mixer) in c.mixers.iter().enumerate() {
            let l = format!("{ROOT}.layers.{i}");
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
    }
    Ok(())
}
