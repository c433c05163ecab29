//! Draft provider `qwen3-native-mtp`: the MTP head Qwen3-Next and Qwen3.5
//! checkpoints carry (`mtp.*`; mlx-lm drops it), drafting for its own
//! target as vLLM's `qwen3_next_mtp` / `qwen3_5_mtp` proposers do. The head
//! shares the target's embedding and output head; each request gets its
//! own key/value cache for the head's layer, whose row `j` pairs token
//! `j + 1` with the target's post-norm hidden state at position `j` (at
//! rope position `j`):
//!
//! - prefill: the prompt's rows, from the target's last-layer taps (the
//!   final norm applied here: the post-norm states the head reads);
//! - draft step `(token, h)`: `out = mtp(token, h)` (normed embedding and
//!   normed `h` joined, `fc`, the decoder layer, the final norm), token
//!   from `lm_head(out)` with the request's sampler; the next step's `h` is
//!   `out`. The first `h` is the target's anchor hidden;
//! - commit `(d, k)`: drop the `d - 1` speculative rows (only the first was
//!   conditioned on a true target hidden), then absorb the `k` accepted
//!   tokens (and any foreign ones after them) paired with the verified
//!   hidden states that predicted them.
//!
//! The provider refuses a target that is not `qwen3_next` / `qwen3_5` /
//! `qwen3_5_moe` and a checkpoint without the MTP head. No options.
#![warn(missing_docs)]

mod source;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};
use spec_models::qwen3_next;

pub use source::Qwen3MtpSource;

/// The registered id.
pub const ID: &str = "qwen3-native-mtp";

fn provider_error(message: impl Into<String>) -> SpecError {
    SpecError::Provider {
        id: ID.to_owned(),
        message: message.into(),
    }
}

/// The hybrid Qwen model behind `target`, if it carries an MTP head.
fn native_model(target: &dyn Target) -> Result<&qwen3_next::Model, SpecError> {
    let model = target
        .as_any()
        .downcast_ref::<qwen3_next::Model>()
        .ok_or_else(|| {
            provider_error(format!(
                "needs a qwen3_next, qwen3_5 or qwen3_5_moe target, not `{}`",
                target.info().model_type
            ))
        })?;
    if !model.has_mtp() {
        return Err(provider_error(
            "this checkpoint has no MTP head (tensors `mtp.*`; mlx-lm conversions drop them, \
             and a pipeline rank holds none)",
        ));
    }
    Ok(model)
}

fn address(model: &qwen3_next::Model) -> usize {
    std::ptr::from_ref(model) as usize
}

/// The MTP drafter of one loaded hybrid Qwen target.
#[derive(Debug)]
pub struct Qwen3MtpProvider {
    /// The target it was built for: a source opened on another is refused.
    target: usize,
}

impl Qwen3MtpProvider {
    /// Checks `target` and builds the provider.
    pub fn new(target: &dyn Target, options: &ProviderOptions) -> Result<Self, SpecError> {
        options.reader(ID, &[])?;
        Ok(Self {
            target: address(native_model(target)?),
        })
    }

    /// A source with its concrete type (inspection, the gate's trace).
    pub fn open_native<'a>(&self, target: &'a dyn Target) -> Result<Qwen3MtpSource<'a>, SpecError> {
        let model = native_model(target)?;
        if address(model) != self.target {
            return Err(provider_error(
                "opened for a different target than the one it was built for",
            ));
        }
        Ok(Qwen3MtpSource::new(model))
    }
}

impl DraftProvider for Qwen3MtpProvider {
    fn id(&self) -> &str {
        ID
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.open_native(target)?))
    }
}

spec_core::register_provider! {
    id: ID,
    description: "the MTP head of Qwen3-Next / Qwen3.5 checkpoints drafts from the target's hidden states (shares the target's weights)",
    build: Qwen3MtpProvider::new,
}
