//! A third-party draft provider: proposes the last token again, `n` times.
//! It exists to show that a crate outside ours adds a provider by linking
//! alone: no edit to mlx-spec, and no dependency but `spec-core`.

use spec_core::mlx_rs::Array;
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, ProviderOptions, Sampler,
    SpecError, Target,
};

/// The id it registers.
pub const ID: &str = "third-party-repeat";

struct Repeat;

impl Repeat {
    fn new(_target: &dyn Target, options: &ProviderOptions) -> Result<Self, SpecError> {
        options.reader(ID, &[])?;
        Ok(Self)
    }
}

struct RepeatSource {
    waiting: bool,
}

impl DraftSource for RepeatSource {
    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        Ok(())
    }
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        if self.waiting {
            return Err(SpecError::Protocol("draft before commit".into()));
        }
        self.waiting = true;
        let last = request.history.last().copied();
        let last = last.ok_or_else(|| SpecError::Protocol("empty history".into()))?;
        Ok(Draft {
            tokens: vec![last; request.max_tokens],
            probs: None,
        })
    }
    fn commit(&mut self, _info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.waiting = false;
        Ok(())
    }
}

impl DraftProvider for Repeat {
    fn id(&self) -> &str {
        ID
    }
    fn open<'a>(&self, _target: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
        Ok(Box::new(RepeatSource { waiting: false }))
    }
}

spec_core::register_provider! {
    id: ID,
    description: "repeats the last token (a third-party example)",
    build: Repeat::new,
}
