//! The per-request source of `gemma4-assistant`: full prefill (the serve
//! loop samples token0 from the last prompt position), no cache of its own;
//! each round freezes the donor views, chains `gamma` drafter steps from the
//! anchor hidden, and commit only keeps the verified hidden that predicted
//! the next pending token.

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, PrefillMode, Sampler, SpecError, Target,
};
use spec_models::gemma4::Model as Gemma4;

use crate::model::AssistantModel;
use crate::{donors, AssistantError};

/// Where the drafter's queries sit across the steps of one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PositionMode {
    /// Step `k` at `offset + k` (optiq 0.7.7, mlx-bun).
    #[default]
    Advancing,
    /// Every step at `offset` (Hugging Face, vLLM, SGLang, Ollama).
    Constant,
}

impl PositionMode {
    /// The query position of step `k` of a round whose target caches hold
    /// `offset` tokens.
    pub fn position(self, offset: usize, k: usize) -> usize {
        match self {
            PositionMode::Advancing => offset + k,
            PositionMode::Constant => offset,
        }
    }
}

/// One request's assistant drafting.
#[derive(Debug)]
pub struct AssistantSource<'a> {
    model: &'a AssistantModel,
    target: &'a dyn Target,
    gemma: &'a Gemma4,
    positions: PositionMode,
    /// The target hidden that predicted the pending token, from the last
    /// commit.
    hidden: Option<Array>,
    /// Drafts of the last round until their commit.
    outstanding: Option<usize>,
    prefilled: bool,
}

impl<'a> AssistantSource<'a> {
    /// A source for one request; `gemma` is `target` as a Gemma-4 model
    /// (see [`donors::check_target`]).
    pub fn new(
        model: &'a AssistantModel,
        target: &'a dyn Target,
        gemma: &'a Gemma4,
        positions: PositionMode,
    ) -> Self {
        Self {
            model,
            target,
            gemma,
            positions,
            hidden: None,
            outstanding: None,
            prefilled: false,
        }
    }

    /// Drafts `n` tokens greedily from `pending`, `hidden` and the caches.
    fn chain(
        &self,
        pending: u32,
        hidden: &Array,
        caches: &spec_core::CacheSet,
        n: usize,
    ) -> Result<Vec<u32>, AssistantError> {
        let donors = donors::read(self.gemma, caches)?;
        let offset = caches.offset();
        let mut token = Array::from_slice(&[pending], &[1, 1]);
        let mut hidden = hidden.clone();
        let mut tokens = Vec::with_capacity(n);
        // The chain stays lazy: each step's argmax feeds the next step's
        // embedding lookup, and one evaluation runs the whole round.
        for k in 0..n {
            let embedding = self
                .target
                .embed(&token)
                .map_err(|source| AssistantError::Target {
                    what: "embedding",
                    source,
                })?;
            let out = self.model.step(
                &embedding,
                &hidden,
                &donors,
                self.positions.position(offset, k),
            )?;
            let next = argmax_axis(&out.logits, 0, None)?.as_dtype(Dtype::Uint32)?;
            tokens.push(next.clone());
            token = next.reshape(&[1, 1])?;
            hidden = out.next_hidden;
        }
        mlx_rs::transforms::eval(tokens.iter())?;
        Ok(tokens
            .iter()
            .map(|t| t.as_slice::<u32>().first().copied().unwrap_or(0))
            .collect())
    }
}

impl DraftSource for AssistantSource<'_> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::Full
    }

    fn drafts_past_max_tokens(&self) -> bool {
        true
    }

    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        if self.prefilled {
            return Err(SpecError::Protocol(
                "prefill on a source that already ran".into(),
            ));
        }
        self.prefilled = true;
        Ok(())
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        _sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        if !self.prefilled {
            return Err(SpecError::Protocol("draft before prefill".into()));
        }
        if self.outstanding.is_some() {
            return Err(SpecError::Protocol(
                "draft before the last draft was committed".into(),
            ));
        }
        let caches = request.target_caches.ok_or_else(|| {
            SpecError::Protocol("the assistant drafter needs the target's caches".into())
        })?;
        let pending = *request
            .feed
            .last()
            .ok_or_else(|| SpecError::Protocol("empty feed".into()))?;
        // The serve loop's anchor is the verified hidden of the last round
        // (also after a round it drafted nothing for); the committed one
        // stands in when a host passes none.
        let hidden = request
            .anchor_hidden
            .or(self.hidden.as_ref())
            .ok_or_else(|| {
                SpecError::Protocol("no hidden state to chain on (full prefill gives one)".into())
            })?
            .clone();
        let tokens = self.chain(pending, &hidden, caches, request.max_tokens)?;
        tracing::trace!(?tokens, offset = caches.offset(), "assistant drafts");
        self.outstanding = Some(tokens.len());
        Ok(Draft {
            tokens,
            probs: None,
        })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        let drafted = self.outstanding.take().unwrap_or(0);
        if info.drafted != drafted || info.accepted > info.drafted {
            return Err(SpecError::Protocol(format!(
                "commit of {} drafts ({} accepted) after a draft of {drafted}",
                info.drafted, info.accepted
            )));
        }
        let at = info.accepted as i32;
        self.hidden = Some(info.verified_hidden.index((.., at..at + 1, ..)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::PositionMode;

    #[test]
    fn advancing_queries_move_one_position_per_step_constant_ones_stay() {
        let steps = |m: PositionMode| (0..3).map(|k| m.position(40, k)).collect::<Vec<_>>();
        assert_eq!(steps(PositionMode::Advancing), [40, 41, 42]);
        assert_eq!(steps(PositionMode::Constant), [40, 40, 40]);
        assert_eq!(PositionMode::default(), PositionMode::Advancing);
    }
}
