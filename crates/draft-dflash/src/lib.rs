//! Draft provider `dflash`: z-lab's DFlash and DFlash2 drafters. It reads
//! the target's hidden states after a few configured layers, projects them
//! into its own context keys and values, and drafts a block in one forward
//! (anchor + mask tokens, non-causal) through the target's own embeddings
//! and head. DFlash2 wraps each sublayer in grouped dynamic causal
//! convolutions and chains its drafts through a candidate selector.
//!
//! Sliding layers (`layer_types`) attend to the last `sliding_window - 1`
//! context rows. While the context fits the window (and on the first block
//! after a prefill) that is `model_mlx.py`'s computation exactly; past it
//! its rotating cache returns rows in slot order and masks them by slot, so
//! there we follow the torch reference (`dflash/model.py`: the window over
//! positions in time order) rather than refuse or stop drafting: drafts
//! only decide speed, the output stays the target's.
//!
//! Options: `model` (the `DFlashDraftModel` directory; required), `dtype`
//! (`f32`, the default, or `keep`). A request that names no draft count
//! drafts a whole block: `block_size - 1` tokens.
#![warn(missing_docs)]

mod attention;
pub mod config;
mod conv;
mod error;
pub mod model;
pub mod quantize;
mod selector;
mod source;

use std::path::PathBuf;
use std::rc::Rc;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};
use spec_runtime::drafter_error::TapFit;
use spec_runtime::{DtypePolicy, LoadOptions};

pub use config::DFlashConfig;
pub use error::DFlashError;
pub use model::DFlashModel;
pub use source::{DFlashDrafter, DFlashSource};
pub use spec_runtime::block_source::BlockProposal;
pub use spec_runtime::drafter_error::DrafterError;

/// The registered id.
pub const ID: &str = "dflash";

/// What the options of `dflash` say.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The drafter checkpoint.
    pub model: PathBuf,
    /// Weight dtype policy.
    pub dtype: DtypePolicy,
}

impl Options {
    /// Parses and checks the option map.
    pub fn parse(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, &["model", "dtype"])?;
        Ok(Self {
            model: options.model()?,
            dtype: options.dtype()?,
        })
    }
}

/// Checks that `model` drafts for `target`: same hidden width and
/// vocabulary (the drafter uses the target's embeddings and head), the same
/// number of layers, every tap inside it.
pub fn check_target(model: &DFlashModel, target: &dyn Target) -> Result<(), DFlashError> {
    let c = model.config();
    let fit = TapFit {
        hidden: c.hidden,
        vocab: c.vocab,
        num_target_layers: c.num_target_layers,
        target_layer_ids: &c.target_layer_ids,
        taps_key: "dflash_config.target_layer_ids",
    };
    Ok(fit.check(target.info())?)
}

/// A DFlash drafter loaded for one target.
#[derive(Debug)]
pub struct DFlashProvider {
    /// Shared with the sources it opened, which may outlive it.
    model: Rc<DFlashModel>,
}

impl DFlashProvider {
    /// Loads the drafter and checks it against the target.
    pub fn new(target: &dyn Target, options: &Options) -> Result<Self, SpecError> {
        let model = DFlashModel::load(
            &options.model,
            &LoadOptions {
                dtype: options.dtype,
                ..LoadOptions::default()
            },
        )
        .map_err(|e| SpecError::provider_failed(ID, e))?;
        Self::from_model(model, target)
    }

    /// Wraps an already loaded drafter.
    pub fn from_model(model: DFlashModel, target: &dyn Target) -> Result<Self, SpecError> {
        check_target(&model, target)?;
        Ok(Self {
            model: Rc::new(model),
        })
    }

    /// The drafter.
    pub fn model(&self) -> &DFlashModel {
        &self.model
    }

    /// A concrete source (the trait's `open` boxes it).
    pub fn source<'t>(&self, target: &'t dyn Target) -> Result<DFlashSource<'t>, SpecError> {
        check_target(&self.model, target)?;
        Ok(DFlashSource::new(DFlashDrafter::new(
            Rc::clone(&self.model),
            target,
        )))
    }
}

impl DraftProvider for DFlashProvider {
    fn id(&self) -> &str {
        ID
    }
    /// A whole block: one forward proposes `block_size - 1` tokens anyway.
    fn default_num_draft(&self) -> usize {
        self.model.config().block_size - 1
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(self.source(target)?))
    }
}

fn build(target: &dyn Target, options: &ProviderOptions) -> Result<DFlashProvider, SpecError> {
    DFlashProvider::new(target, &Options::parse(options)?)
}

spec_core::register_provider! {
    id: ID,
    description: "DFlash / DFlash2 (z-lab): one block forward from tapped target hidden states, with the target's embeddings and head",
    build: build,
}
