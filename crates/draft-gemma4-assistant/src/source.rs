//! The per-request source of `gemma4-assistant`: full prefill (the serve
//! loop samples token0 from the last prompt position), no cache of its own;
//! each round freezes the donor views, chains `gamma` drafter steps from the
//! anchor hidden, and commit only keeps the verified hidden that predicted
//! the next pending token.

use std::rc::Rc;

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{Array, Dtype};
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, PrefillMode, Sampler, SpecError, Target,
};
use spec_models::gemma4::Model as Gemma4;

use crate::model::AssistantModel;
use crate::{donors, AssistantError};

/// Where the drafter's queries sit across the steps of one round. A round
/// starts with the target caches holding `offset` tokens, so the pending
/// token (the first step's input) sits at index `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PositionMode {
    /// Every step at `offset`, the pending token's index: the publisher's
    /// reference (transformers' `SinglePositionMultiTokenCandidateGenerator`),
    /// vLLM and SGLang.
    #[default]
    Constant,
    /// Step `k` at `offset + k` (optiq 0.7.7's `spec_generate`).
    Advancing,
    /// Step `k` at `offset - 1 + k`: the first step at the position of the
    /// token whose hidden state it chains on, then advancing (the seed,
    /// mlx-bun 0.0.12).
    AdvancingFromLastCached,
}

impl PositionMode {
    /// Every mode with its name in the provider option `positions`.
    pub const CHOICES: [(&'static str, PositionMode); 3] = [
        ("constant", PositionMode::Constant),
        ("advancing", PositionMode::Advancing),
        (
            "advancing-from-last-cached",
            PositionMode::AdvancingFromLastCached,
        ),
    ];

    /// The query position of step `k` of a round whose target caches hold
    /// `offset` tokens (`offset >= 1` after a full prefill; an empty cache
    /// puts the last-cached mode's first step at 0).
    pub fn position(self, offset: usize, k: usize) -> usize {
        match self {
            PositionMode::Constant => offset,
            PositionMode::Advancing => offset + k,
            PositionMode::AdvancingFromLastCached => offset.saturating_sub(1) + k,
        }
    }
}

/// One round of drafts: the tokens and each step's logits (`[V]`).
#[derive(Debug)]
pub struct Round {
    /// Drafted tokens, greedy.
    pub tokens: Vec<u32>,
    /// The drafter's logits at each step, evaluated.
    pub logits: Vec<Array>,
}

/// One request's assistant drafting.
#[derive(Debug)]
pub struct AssistantSource<'a> {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<AssistantModel>,
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
        model: Rc<AssistantModel>,
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

    /// Drafts `n` tokens greedily from `pending`, `hidden` (the target's
    /// post-norm hidden that predicted `pending`, `[1, 1, backbone]`) and the
    /// target caches, each step's query placed by the source's position
    /// mode.
    pub fn round(
        &self,
        pending: u32,
        hidden: &Array,
        caches: &spec_core::CacheSet,
        n: usize,
    ) -> Result<Round, AssistantError> {
        let donors = donors::read(self.gemma, caches)?;
        let offset = caches.offset();
        let mut token = Array::from_slice(&[pending], &[1, 1]);
        let mut hidden = hidden.clone();
        let (mut tokens, mut logits) = (Vec::with_capacity(n), Vec::with_capacity(n));
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
            logits.push(out.logits);
            token = next.reshape(&[1, 1])?;
            hidden = out.next_hidden;
        }
        mlx_rs::transforms::eval(tokens.iter().chain(&logits))?;
        Ok(Round {
            tokens: tokens
                .iter()
                .map(|t| t.as_slice::<u32>().first().copied().unwrap_or(0))
                .collect(),
            logits,
        })
    }
}

impl DraftSource for AssistantSource<'_> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::Full
    }

    fn drafts_past_max_tokens(&self) -> bool {
        true
    }

    /// The source keeps only the hidden state that predicted the pending
    /// token: after foreign tokens, the one after them.
    fn takes_foreign_tokens(&self) -> bool {
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
        let tokens = self
            .round(pending, &hidden, caches, request.max_tokens)?
            .tokens;
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
                "commit of {} drafts ({} accepted, {} foreign) after a draft of {drafted}",
                info.drafted,
                info.accepted,
                info.foreign.len()
            )));
        }
        let at = (info.accepted + info.foreign.len()) as i32;
        self.hidden = Some(info.verified_hidden.index((.., at..at + 1, ..)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::PositionMode;

    #[test]
    fn each_mode_places_a_rounds_queries() {
        let check = |mode: PositionMode, offset: usize, want: &[usize]| {
            let got: Vec<usize> = (0..want.len()).map(|k| mode.position(offset, k)).collect();
            assert_eq!(got, want, "{mode:?} from offset {offset}");
        };
        check(PositionMode::Constant, 40, &[40, 40, 40, 40]);
        check(PositionMode::Advancing, 40, &[40, 41, 42, 43]);
        check(PositionMode::AdvancingFromLastCached, 40, &[39, 40, 41, 42]);
        check(PositionMode::Constant, 1, &[1, 1]);
        check(PositionMode::AdvancingFromLastCached, 1, &[0, 1]);
        check(PositionMode::AdvancingFromLastCached, 0, &[0, 1]);
        assert_eq!(PositionMode::default(), PositionMode::Constant);
    }

    #[test]
    fn every_mode_has_one_option_name() {
        let names: Vec<&str> = PositionMode::CHOICES.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["constant", "advancing", "advancing-from-last-cached"]
        );
        for mode in [
            PositionMode::Constant,
            PositionMode::Advancing,
            PositionMode::AdvancingFromLastCached,
        ] {
            let named = PositionMode::CHOICES.iter().filter(|(_, m)| *m == mode);
            assert_eq!(named.count(), 1, "{mode:?}");
        }
    }
}
