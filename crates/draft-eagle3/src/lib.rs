//! Draft provider `eagle3`: EAGLE-3 heads as SpecForge and the EAGLE
//! authors publish them (`LlamaForCausalLMEagle3`: the target's low, mid
//! and high layer features fused by `fc`, one decoder layer over
//! `[embedding; hidden]`, its own `lm_head` over a reduced draft vocabulary
//! mapped to the target's by `d2t`), chain-drafting from the target's
//! tapped layers (`model.rs`, `source.rs`). The fused features are the
//! inputs of the target layers `eagle_config.eagle_aux_hidden_state_layer_ids`
//! (vLLM's default `(2, L / 2, L - 3)`), i.e. the outputs of the layers
//! before them.
//!
//! Options: `model` (the head's directory), `dtype`. The head is refused
//! at open when it does not fit the target (vocabulary, hidden width,
//! feature layers beyond its depth), naming the key.
#![warn(missing_docs)]

pub mod config;
pub mod model;
pub mod quantize;
mod source;

use std::path::PathBuf;
use std::rc::Rc;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};
use spec_runtime::{DtypePolicy, LoadOptions};

pub use config::Eagle3Config;
pub use model::Eagle3Model;
pub use source::Eagle3Source;

/// The registered id.
pub const ID: &str = "eagle3";

fn provider_error(message: impl Into<String>) -> SpecError {
    SpecError::Provider {
        id: ID.to_owned(),
        message: message.into(),
    }
}

/// The provider's options.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The head's checkpoint directory.
    pub model: PathBuf,
    /// How its weights are loaded.
    pub dtype: DtypePolicy,
}

impl Options {
    /// Reads `model` (required) and `dtype`.
    pub fn parse(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, &["model", "dtype"])?;
        Ok(Self {
            model: options.model()?,
            dtype: options.dtype()?,
        })
    }
}

/// The target layers to tap for `model` on `target` (the outputs of the
/// layers before the fused inputs), after checking the head fits it.
pub fn tap_layers(model: &Eagle3Model, target: &dyn Target) -> Result<Vec<usize>, SpecError> {
    let (c, t) = (model.config(), target.info());
    let mismatch = |key: &str, head: String, target: String| {
        Err(provider_error(format!(
            "`{key}` is {head} but the target has {target}"
        )))
    };
    if c.vocab as usize != t.vocab_size {
        return mismatch("vocab_size", c.vocab.to_string(), t.vocab_size.to_string());
    }
    if c.target_hidden as usize != t.hidden_size {
        return mismatch(
            "target_hidden_size",
            c.target_hidden.to_string(),
            format!("hidden size {}", t.hidden_size),
        );
    }
    if !model.has_embedding() && c.hidden as usize != t.hidden_size {
        return mismatch(
            "hidden_size",
            c.hidden.to_string(),
            format!(
                "an embedding of width {} (the head has none of its own)",
                t.hidden_size
            ),
        );
    }
    let ids = c.aux_layers(t.num_layers);
    if let Some(bad) = ids.iter().find(|&&i| i == 0 || i >= t.num_layers) {
        return mismatch(
            "eagle_config.eagle_aux_hidden_state_layer_ids",
            format!(
                "{ids:?} (layer {bad}: the input of a layer in 1..{})",
                t.num_layers
            ),
            format!("{} layers", t.num_layers),
        );
    }
    Ok(ids.iter().map(|i| i - 1).collect())
}

/// An EAGLE-3 head loaded for one target.
#[derive(Debug)]
pub struct Eagle3Provider {
    model: Rc<Eagle3Model>,
    taps: Vec<usize>,
}

impl Eagle3Provider {
    /// Loads the head named by `options` for `target`.
    pub fn new(target: &dyn Target, options: &Options) -> Result<Self, SpecError> {
        let model = Eagle3Model::load(
            &options.model,
            &LoadOptions {
                dtype: options.dtype,
                ..LoadOptions::default()
            },
        )
        .map_err(|e| SpecError::provider_failed(ID, e))?;
        Self::from_model(model, target)
    }

    /// A provider over a loaded head.
    pub fn from_model(model: Eagle3Model, target: &dyn Target) -> Result<Self, SpecError> {
        let taps = tap_layers(&model, target)?;
        Ok(Self {
            model: Rc::new(model),
            taps,
        })
    }

    /// The head.
    pub fn model(&self) -> &Eagle3Model {
        &self.model
    }

    /// A source with its concrete type (inspection, the gate's trace); a
    /// target the head does not fit (another vocabulary, width or depth) is
    /// refused as at build.
    pub fn open_native<'a>(&self, target: &'a dyn Target) -> Result<Eagle3Source<'a>, SpecError> {
        let taps = tap_layers(&self.model, target)?;
        if taps != self.taps {
            return Err(provider_error(format!(
                "built for a target of taps {:?}, opened on one of taps {taps:?}",
                self.taps
            )));
        }
        Ok(Eagle3Source::new(Rc::clone(&self.model), target, taps))
    }
}

impl DraftProvider for Eagle3Provider {
    fn id(&self) -> &str {
        ID
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.open_native(target)?))
    }
}

fn build(target: &dyn Target, options: &ProviderOptions) -> Result<Eagle3Provider, SpecError> {
    Eagle3Provider::new(target, &Options::parse(options)?)
}

spec_core::register_provider! {
    id: ID,
    description: "EAGLE-3 heads: one decoder layer over fused low/mid/high target features, chain drafting over a reduced vocabulary (option model=DIR)",
    build: build,
}
