//! Reading the donors from a Gemma-4 target's caches, and the checks at
//! open that the target can host the drafter.

use mlx_rs::ops::indexing::IndexOp;
use spec_core::{CacheSet, Target};
use spec_models::gemma4::{self, LayerKind as TargetKind, Model as Gemma4};

use crate::block::DonorKv;
use crate::config::{AssistantConfig, LayerKind};
use crate::model::DonorPair;
use crate::AssistantError;

/// `model_type`s of the Gemma-4 targets this drafter runs on.
pub const TARGET_MODEL_TYPES: &[&str] = &["gemma4_text", "gemma4"];

/// The target as a Gemma-4 model, after checking it can host `config`: its
/// hidden size is `backbone_hidden_size`, its vocabulary the drafter's, and
/// it has a donor of every kind the drafter's blocks read, with key heads
/// the query heads group over and the drafter's head width.
pub fn check_target<'a>(
    target: &'a dyn Target,
    config: &AssistantConfig,
) -> Result<&'a Gemma4, AssistantError> {
    let info = target.info();
    let bad = |m: String| Err(AssistantError::IncompatibleTarget(m));
    if !TARGET_MODEL_TYPES.contains(&info.model_type.as_str()) {
        return bad(format!(
            "target model_type `{}` is not a Gemma-4 (gemma4_text or gemma4)",
            info.model_type
        ));
    }
    let Some(model) = target.as_any().downcast_ref::<Gemma4>() else {
        return bad(format!(
            "target of model_type `{}` is not this crate's Gemma-4 implementation",
            info.model_type
        ));
    };
    if info.hidden_size != config.backbone_hidden as usize {
        return bad(format!(
            "target hidden size {} differs from the assistant's backbone_hidden_size {}",
            info.hidden_size, config.backbone_hidden
        ));
    }
    if info.vocab_size != config.vocab as usize {
        return bad(format!(
            "target vocabulary ({} tokens) differs from the assistant's ({})",
            info.vocab_size, config.vocab
        ));
    }
    let (sliding, full) = model.donor_layers();
    let layers = &model.config().layers;
    for (kind, donor, target_kind) in [
        (LayerKind::Sliding, sliding, TargetKind::Sliding),
        (LayerKind::Full, full, TargetKind::Full),
    ] {
        if !config.uses(kind) {
            continue;
        }
        let Some(spec) = donor.and_then(|i| layers.get(i)) else {
            return bad(format!("the assistant has {kind:?} blocks but the target has no {target_kind:?} layer that owns a cache"));
        };
        let want = config.head_dim_of(kind);
        if spec.head_dim != want {
            return bad(format!("the target's {kind:?} donor has head width {}, the assistant's {kind:?} blocks {want}", spec.head_dim));
        }
        let repeat = config.heads / config.kv_heads;
        if config.heads % (spec.kv_heads * repeat) != 0 {
            return bad(format!(
                "the assistant's {} query heads ({repeat} per num_key_value_heads) do not group over the {kind:?} donor's {} key/value heads",
                config.heads, spec.kv_heads
            ));
        }
    }
    Ok(model)
}

/// The donors as optiq reads them: the sliding donor's newest
/// `min(offset, window - 1)` positions (what the target's own next query
/// would see), the full donor's every position.
pub fn read(model: &Gemma4, caches: &CacheSet) -> Result<DonorPair, AssistantError> {
    let views = gemma4::donor_views(model, caches).map_err(|source| AssistantError::Target {
        what: "donor caches",
        source,
    })?;
    let window = model.config().sliding_window;
    let sliding = views.sliding.map(|v| {
        let rows = v.keys.shape().get(2).copied().unwrap_or(0).max(0) as usize;
        let keep = v.offset.min(window.saturating_sub(1)).min(rows);
        let from = (rows - keep) as i32;
        DonorKv {
            keys: v.keys.index((.., .., from.., ..)),
            values: v.values.index((.., .., from.., ..)),
        }
    });
    let full = views.full.map(|v| DonorKv {
        keys: v.keys,
        values: v.values,
    });
    Ok(DonorPair { sliding, full })
}
