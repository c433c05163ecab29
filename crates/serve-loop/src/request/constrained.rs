//! A request's constraint as the loop drives it: drafts cut at the first
//! token it refuses, the tokens it forces proposed as drafts, one mask per
//! verified position (the state that position has), and only emitted
//! tokens committed. The time it takes is counted in the request's stats:
//! the constraint's own calls apart from the masks' application.

use std::time::Instant;

use spec_core::{Constraint, SpecStats, TokenMask};

use crate::ServeError;

/// Most forced tokens drafted in one round.
pub(super) const MAX_FORCED: usize = 16;

/// A request's constraint and the masks of its current verify window.
pub(super) struct Constrained {
    constraint: Box<dyn Constraint>,
    /// The request's EOS tokens: allowed wherever the constraint may end.
    eos: Vec<u32>,
    /// The drafts of the planned window whose masks are still to compute.
    planned: Option<Vec<u32>>,
    /// The masks of the current window's positions (or of the first
    /// token's), `None` once used.
    masks: Option<Vec<TokenMask>>,
    /// Whether forced tokens are drafted.
    drafts_forced: bool,
}

impl Constrained {
    pub(super) fn new(constraint: Box<dyn Constraint>, eos: Vec<u32>, drafts_forced: bool) -> Self {
        Self {
            constraint,
            eos,
            planned: None,
            masks: None,
            drafts_forced,
        }
    }

    /// Whether forced tokens are drafted.
    pub(super) fn drafts_forced(&self) -> bool {
        self.drafts_forced
    }

    /// How many leading `drafts` the constraint allows.
    pub(super) fn allowed(
        &mut self,
        drafts: &[u32],
        stats: &mut SpecStats,
    ) -> Result<usize, ServeError> {
        if drafts.is_empty() {
            return Ok(0);
        }
        let start = Instant::now();
        let kept = self.constraint.validate(drafts)?.min(drafts.len());
        stats.grammar_seconds += start.elapsed().as_secs_f64();
        stats.refused_drafts += drafts.len() - kept;
        Ok(kept)
    }

    /// The tokens the constraint forces after `prefix`, at most `max`.
    pub(super) fn forced(
        &mut self,
        prefix: &[u32],
        max: usize,
        stats: &mut SpecStats,
    ) -> Result<Vec<u32>, ServeError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let mut forced = self.constraint.forced(prefix, max)?;
        forced.truncate(max);
        stats.grammar_seconds += start.elapsed().as_secs_f64();
        Ok(forced)
    }

    /// Notes the window whose drafts are `drafts` (allowed ones): its masks
    /// are computed by [`Constrained::prepare_planned`], while the step's
    /// forward runs.
    pub(super) fn plan(&mut self, drafts: Vec<u32>) {
        self.masks = None;
        self.planned = Some(drafts);
    }

    /// Computes the planned window's masks, if not done yet.
    pub(super) fn prepare_planned(&mut self, stats: &mut SpecStats) -> Result<(), ServeError> {
        match self.planned.take() {
            Some(drafts) => self.prepare(&drafts, stats),
            None => Ok(()),
        }
    }

    /// Computes the masks of a window whose drafts are `drafts` (allowed
    /// ones): one per position, the request's EOS tokens allowed where the
    /// constraint may end.
    pub(super) fn prepare(
        &mut self,
        drafts: &[u32],
        stats: &mut SpecStats,
    ) -> Result<(), ServeError> {
        let start = Instant::now();
        let mut masks = self.constraint.masks(drafts)?;
        if masks.len() != drafts.len() + 1 {
            return Err(ServeError::Spec(spec_core::SpecError::Constraint(format!(
                "{} masks for a window of {} positions",
                masks.len(),
                drafts.len() + 1
            ))));
        }
        stats.masks += masks.len();
        stats.grammar_seconds += start.elapsed().as_secs_f64();
        let start = Instant::now();
        for mask in masks.iter_mut().filter(|m| m.end_allowed) {
            for &id in &self.eos {
                mask.allow(id);
            }
        }
        stats.mask_apply_seconds += start.elapsed().as_secs_f64();
        self.masks = Some(masks);
        Ok(())
    }

    /// The mask of the prepared window's position `i`.
    pub(super) fn mask(&self, i: usize) -> Option<&TokenMask> {
        self.masks.as_ref().and_then(|m| m.get(i))
    }

    /// Forgets the prepared masks (the window was verified or dropped).
    pub(super) fn clear(&mut self) {
        self.planned = None;
        self.masks = None;
    }

    /// Advances over an emitted token.
    pub(super) fn commit(&mut self, token: u32) -> Result<(), ServeError> {
        Ok(self.constraint.commit(&[token])?)
    }

    /// Whether nothing but the end may follow.
    pub(super) fn is_complete(&self) -> bool {
        self.constraint.is_complete()
    }
}
