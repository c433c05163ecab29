//! Draft provider `glm52-native-mtp`: GLM-5.x's own multi-token-prediction
//! row drafts for its target (mlx-bun's native MTP source, after the Colibri
//! C engine). The row shares the target's embedding, output head and every
//! loaded weight (it holds no weights of its own); each request gets its own MTP latent
//! cache, which starts empty (no prefill) and follows the target's
//! verified hidden states:
//!
//! - draft step `(token, h)`: `x = eh_proj([enorm(embed(token)); hnorm(h)])`,
//!   `out = layer(x)` (MLA + MoE; sparse through the row's own DSA indexer
//!   and indexer cache when the checkpoint carries them, as GLM-5.2 does,
//!   dense otherwise), token from
//!   `lm_head(shared_head.norm(out))` with the request's sampler; the next
//!   step's `h` is `out`. The first `h` is the target's anchor hidden.
//! - commit `(d, k)`: drop the `d - 1` speculative rows (only the first was
//!   conditioned on a true target hidden), then absorb the `k` accepted
//!   tokens paired with the verified hidden states that predicted them;
//!   the cache then holds `round start + (d > 0) + k` rows.
//! - `index_share_for_mtp_iteration` (GLM-5.2): only a round's first step
//!   runs the MTP indexer; the later steps attend to its picks plus the
//!   positions drafted since (`glm::Model::mtp_draft_step`).
//!
//! The provider refuses a target that is not `glm_moe_dsa`, a checkpoint
//! without its MTP row, a model loaded with MTP disabled, and a next-n count
//! other than 1. No options.
#![warn(missing_docs)]

mod source;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};
use spec_models::glm;

pub use source::Glm52MtpSource;

/// The registered id.
pub const ID: &str = "glm52-native-mtp";

fn provider_error(message: impl Into<String>) -> SpecError {
    SpecError::Provider {
        id: ID.to_owned(),
        message: message.into(),
    }
}

/// The GLM model behind `target`, if it is one that can draft natively.
fn native_model(target: &dyn Target) -> Result<&glm::Model, SpecError> {
    let model = target
        .as_any()
        .downcast_ref::<glm::Model>()
        .ok_or_else(|| {
            provider_error(format!(
                "needs a glm_moe_dsa target, not `{}`",
                target.info().model_type
            ))
        })?;
    let caps = model.capabilities();
    if !caps.mtp_present {
        return Err(provider_error(format!(
            "this checkpoint has no complete MTP row (tensors `model.layers.{}.*`): mlx-lm conversions drop it",
            model.config().layers
        )));
    }
    if !caps.mtp_enabled {
        return Err(provider_error(
            "native MTP is disabled for this model instance (loaded without its MTP row)",
        ));
    }
    if model.expert_stats().is_some() && model.mtp_expert_bits() != Some(8) {
        return Err(provider_error(
            "a target with streamed experts (`--expert-cache-bytes`) needs the MTP row's \
             experts resident at 8 bits (`--mtp-expert-bits 8`): 4-bit MTP experts draft \
             almost nothing (Colibri measured 0-4% acceptance)",
        ));
    }
    if caps.nextn_layers != 1 {
        return Err(provider_error(format!(
            "native MTP needs exactly one next-token layer, the config has {}",
            caps.nextn_layers
        )));
    }
    Ok(model)
}

fn address(model: &glm::Model) -> usize {
    std::ptr::from_ref(model) as usize
}

/// The native MTP drafter of one loaded GLM target.
#[derive(Debug)]
pub struct Glm52MtpProvider {
    /// The target it was built for: a source opened on another is refused.
    target: usize,
}

impl Glm52MtpProvider {
    /// Checks `target` and builds the provider.
    pub fn new(target: &dyn Target, options: &ProviderOptions) -> Result<Self, SpecError> {
        options.reader(ID, &[])?;
        Ok(Self {
            target: address(native_model(target)?),
        })
    }

    /// A source with its concrete type (persistence, inspection).
    pub fn open_native<'a>(&self, target: &'a dyn Target) -> Result<Glm52MtpSource<'a>, SpecError> {
        let model = native_model(target)?;
        if address(model) != self.target {
            return Err(provider_error(
                "opened for a different target than the one it was built for",
            ));
        }
        Ok(Glm52MtpSource::new(model))
    }
}

impl DraftProvider for Glm52MtpProvider {
    fn id(&self) -> &str {
        ID
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.open_native(target)?))
    }
}

spec_core::register_provider! {
    id: ID,
    description: "GLM-5.x's own MTP row drafts from the target's hidden states (shares the target's weights)",
    build: Glm52MtpProvider::new,
}
