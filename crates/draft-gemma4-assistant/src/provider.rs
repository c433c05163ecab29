//! The provider: options, the target checks at open, registration.

use std::path::PathBuf;
use std::rc::Rc;

use spec_core::{DraftProvider, DraftSource, ProviderOptions, SpecError, Target};
use spec_models::DtypePolicy;

use crate::source::{AssistantSource, PositionMode};
use crate::{donors, AssistantModel, ID};

/// What the options of `gemma4-assistant` say.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The assistant checkpoint directory.
    pub model: PathBuf,
    /// Query positions across a round's steps (option `positions`:
    /// `constant`, the default, `advancing` or `advancing-from-last-cached`).
    pub positions: PositionMode,
    /// Weight dtype policy.
    pub dtype: DtypePolicy,
}

impl Options {
    /// Options known to the provider.
    pub const KNOWN: &'static [&'static str] = &["model", "positions", "dtype"];

    /// Parses and checks the option map.
    pub fn parse(options: &ProviderOptions) -> Result<Self, SpecError> {
        let options = options.reader(ID, Self::KNOWN)?;
        let positions = options.choice("positions", &PositionMode::CHOICES)?;
        Ok(Self {
            model: options.model()?,
            positions: positions.unwrap_or_default(),
            dtype: options.dtype()?,
        })
    }
}

/// A Gemma-4 assistant loaded for one target.
#[derive(Debug)]
pub struct AssistantProvider {
    /// Shared with the sources it opened, which may outlive it.
    model: Rc<AssistantModel>,
    positions: PositionMode,
}

impl AssistantProvider {
    /// Loads the assistant and checks it against the target.
    pub fn new(target: &dyn Target, options: &Options) -> Result<Self, SpecError> {
        let model = AssistantModel::load(&options.model, options.dtype)?;
        Self::from_model(target, model, options.positions)
    }

    /// Wraps a loaded assistant after checking it against the target.
    pub fn from_model(
        target: &dyn Target,
        model: AssistantModel,
        positions: PositionMode,
    ) -> Result<Self, SpecError> {
        donors::check_target(target, model.config())?;
        Ok(Self {
            model: Rc::new(model),
            positions,
        })
    }

    /// The drafter.
    pub fn model(&self) -> &AssistantModel {
        &self.model
    }
}

impl DraftProvider for AssistantProvider {
    fn id(&self) -> &str {
        ID
    }
    fn open<'a>(&self, target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        let gemma = donors::check_target(target, self.model.config())?;
        Ok(Box::new(AssistantSource::new(
            Rc::clone(&self.model),
            target,
            gemma,
            self.positions,
        )))
    }
}

fn build(target: &dyn Target, options: &ProviderOptions) -> Result<AssistantProvider, SpecError> {
    AssistantProvider::new(target, &Options::parse(options)?)
}

spec_core::register_provider! {
    id: ID,
    description: "Gemma-4 assistant: a Q-only drafter over the target's own KV caches (queries at one constant position, as transformers' reference)",
    build: build,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(positions: Option<&str>) -> Result<Options, SpecError> {
        let mut options = ProviderOptions::from([("model".to_owned(), "/m".to_owned())]);
        if let Some(p) = positions {
            options.insert("positions".to_owned(), p.to_owned());
        }
        Options::parse(&options)
    }

    #[test]
    fn positions_names_each_mode_and_defaults_to_constant() {
        let mode = |p| parse(p).expect("parse").positions;
        assert_eq!(mode(None), PositionMode::Constant);
        assert_eq!(mode(Some("constant")), PositionMode::Constant);
        assert_eq!(mode(Some("advancing")), PositionMode::Advancing);
        assert_eq!(
            mode(Some("advancing-from-last-cached")),
            PositionMode::AdvancingFromLastCached
        );
        let err = parse(Some("offset-1"))
            .expect_err("unknown mode")
            .to_string();
        assert!(
            err.contains("constant, advancing or advancing-from-last-cached"),
            "{err}"
        );
    }
}
