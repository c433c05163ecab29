//! Draft provider `deepspec`: the DSpark drafter (DeepSeek's DeepSpec). It
//! reads the target's hidden states after a few configured layers, projects
//! them into its own context keys and values, and drafts a whole block in
//! one forward (anchor + mask tokens, non-causal), corrected token by token
//! by a low-rank Markov head, and cut where a confidence head falls under a
//! threshold (possibly to 0 tokens: a plain target step that round).
//!
//! Options: `model` (the `Gemma4DSparkModel` directory; required),
//! `threshold` (confidence cut in `[0, 1)`, default 0 = no cut), `dtype`
//! (`f32`, the default, or `keep`). A request that names no draft count
//! drafts the drafter's trained block width (config `block_size`).
#![warn(missing_docs)]

pub mod config;
mod error;
pub mod model;
pub mod quantize;
mod source;

use std::path::PathBuf;
use std::rc::Rc;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};
use spec_runtime::drafter_error::TapFit;
use spec_runtime::{DtypePolicy, LoadOptions};

pub use config::DSparkConfig;
pub use error::DSparkError;
pub use model::{Context, DSparkModel};
pub use source::{DSparkDrafter, DSparkSource};
pub use spec_runtime::block_source::BlockProposal;
pub use spec_runtime::drafter_error::DrafterError;

/// The registered id.
pub const ID: &str = "deepspec";

fn provider_error(message: impl Into<String>) -> SpecError {
    SpecError::Provider {
        id: ID.to_owned(),
        message: message.into(),
    }
}

/// What the options of `deepspec` say.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The drafter checkpoint.
    pub model: PathBuf,
    /// Confidence threshold (0: never cut).
    pub threshold: f32,
    /// Weight dtype policy.
    pub dtype: DtypePolicy,
}

impl Options {
    /// Parses and checks the option map.
    pub fn parse(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, &["model", "threshold", "dtype"])?;
        let threshold = options.parse_with("threshold", "a number in [0, 1)", |t| {
            t.parse::<f32>().ok().filter(|t| (0.0..1.0).contains(t))
        })?;
        Ok(Self {
            model: options.model()?,
            threshold: threshold.unwrap_or(0.0),
            dtype: options.dtype()?,
        })
    }
}

/// Checks that `model` drafts for `target`: same hidden width and
/// vocabulary, the same number of layers, every tap inside it.
pub fn check_target(model: &DSparkModel, target: &dyn Target) -> Result<(), DSparkError> {
    let c = model.config();
    let fit = TapFit {
        hidden: c.hidden,
        vocab: c.vocab,
        num_target_layers: c.num_target_layers,
        target_layer_ids: &c.target_layer_ids,
        taps_key: "target_layer_ids",
    };
    Ok(fit.check(target.info())?)
}

/// A DSpark drafter loaded for one target.
#[derive(Debug)]
pub struct DSparkProvider {
    /// Shared with the sources it opened, which may outlive it.
    model: Rc<DSparkModel>,
    threshold: f32,
}

impl DSparkProvider {
    /// Loads the drafter and checks it against the target.
    pub fn new(target: &dyn Target, options: &Options) -> Result<Self, SpecError> {
        let model = DSparkModel::load(
            &options.model,
            &LoadOptions {
                dtype: options.dtype,
                ..LoadOptions::default()
            },
        )
        .map_err(|e| SpecError::provider_failed(ID, e))?;
        Self::from_model(model, target, options.threshold)
    }

    /// Wraps an already loaded drafter.
    pub fn from_model(
        model: DSparkModel,
        target: &dyn Target,
        threshold: f32,
    ) -> Result<Self, SpecError> {
        check_target(&model, target)?;
        if threshold > 0.0 && !model.config().confidence_head {
            return Err(provider_error(format!(
                "threshold {threshold} needs a confidence head, and this checkpoint has none"
            )));
        }
        Ok(Self {
            model: Rc::new(model),
            threshold,
        })
    }

    /// The drafter.
    pub fn model(&self) -> &DSparkModel {
        &self.model
    }

    /// A concrete source (the trait's `open` boxes it).
    pub fn source(&self, target: &dyn Target) -> Result<DSparkSource, SpecError> {
        check_target(&self.model, target)?;
        Ok(DSparkSource::new(DSparkDrafter::new(
            Rc::clone(&self.model),
            self.threshold,
        )))
    }
}

impl DraftProvider for DSparkProvider {
    fn id(&self) -> &str {
        ID
    }
    /// The drafter's trained block width (config `block_size`), as
    /// mlx-bun pins it: one block forward proposes that many tokens anyway.
    fn default_num_draft(&self) -> usize {
        self.model.config().block_size
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.source(target)?))
    }
}

fn build(target: &dyn Target, options: &ProviderOptions) -> Result<DSparkProvider, SpecError> {
    DSparkProvider::new(target, &Options::parse(options)?)
}

spec_core::register_provider! {
    id: ID,
    description: "DSpark (DeepSpec): one block forward from tapped target hidden states, Markov-corrected, confidence-cut",
    build: build,
}
