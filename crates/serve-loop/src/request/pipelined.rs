//! Plain decoding of a lone request without logits processors, pipelined as
//! mlx-lm does: the next step's forward is queued (on the lazily sampled
//! token) before the current token is read back, so the CPU never idles
//! between steps. Each step computes what a plain row of a batched step
//! computes (the pending token alone, its logits, the sampler's draw), so
//! the tokens are the same either way. `generate` runs it to the end; the
//! engine runs it while the request is alone and stops it (between two
//! tokens, in the state a batched step leaves) when something else needs a
//! step.

use std::sync::atomic::Ordering;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{SpecStats, Target};

use super::{token_of, RequestState};
use crate::{Finish, ServeError};

impl RequestState<'_> {
    /// Decodes until the request ends or `interrupt` answers `true` (asked
    /// before each step is queued); returns the target forwards run. An
    /// interrupted request is left decoding, as a batched step leaves it:
    /// its last token emitted and pending, the caches holding the tokens
    /// before it. A failure fails the request, its caches rolled back to
    /// where the last emitted token left them.
    pub(crate) fn decode_pipelined(&mut self, interrupt: &mut dyn FnMut() -> bool) -> usize {
        let before = self.stats.target_calls;
        match self.pipelined(interrupt) {
            Ok(Some(finish)) => self.end(finish),
            Ok(None) => {
                self.round.resume_from(self.round.pending);
                self.step_start = self.caches.offset();
            }
            Err(e) => {
                // The queued step may have appended past the last emitted
                // token's row.
                self.step_start = self.history.len() - 1;
                self.fail(e);
            }
        }
        self.stats.target_calls.saturating_sub(before)
    }

    /// `Some(finish)` when the request ended, `None` when interrupted.
    fn pipelined(
        &mut self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Finish>, ServeError> {
        self.step_start = self.caches.offset();
        if interrupt() {
            return Ok(None);
        }
        let target = self.target;
        let caches = &mut self.caches;
        let sampler = &mut self.sampler;
        let mut step =
            |input: &Array, stats: &mut SpecStats| -> Result<(Array, Array), ServeError> {
                // A failure rolls back to the last emitted token: at most
                // the token before this step stays uncommitted.
                caches.commit_to(caches.offset().saturating_sub(1));
                let out = target.decode(&input.reshape(&[1, 1])?, caches, &[])?;
                let logits = target.logits(&out.hidden.index((.., -1, ..)))?;
                let lp = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
                stats.record_round(0, 0);
                let y = sampler.sample(&lp)?.as_dtype(Dtype::Uint32)?;
                let chosen = lp.take_along_axis(y.reshape(&[1, 1])?, -1)?;
                mlx_rs::transforms::async_eval([&y, &chosen])?;
                Ok((y, chosen))
            };
        let stats = &mut self.stats;
        let mut y = step(&Array::from_slice(&[self.round.pending], &[1]), stats)?;
        loop {
            if self
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
            {
                mlx_rs::transforms::eval([&y.0, &y.1])?;
                return Ok(Some(Finish::Cancelled));
            }
            // Queue the next step before waiting on this one, unless this is
            // the last token or the request must stop after it.
            let next = if self.sink.has_room_after_next() && !interrupt() {
                Some(step(&y.0, stats)?)
            } else {
                None
            };
            let token = token_of(&y.0)?;
            mlx_rs::transforms::eval([&y.1])?;
            let logprob = y.1.as_slice::<f32>().first().copied().unwrap_or(f32::NAN);
            if let Some(finish) = self
                .sink
                .emit(&mut self.history, token, logprob, Vec::new())
            {
                // Never leave the queued step running behind our back: a
                // process that exits while MLX still computes on its stream
                // thread can deadlock in OpenBLAS's shutdown or corrupt the
                // heap (seen).
                if let Some((n, c)) = &next {
                    mlx_rs::transforms::eval([n, c])?;
                }
                return Ok(Some(finish));
            }
            self.round.pending = token;
            match next {
                Some(n) => y = n,
                // Not the last token (that one finished above): interrupted.
                None => return Ok(None),
            }
        }
    }
}

/// Several plain requests' next tokens, queued: `[1, n]` ids (row `i`'s in
/// column `i`) and the log-probabilities of those tokens, `[1, n]`.
struct Queued {
    ids: Array,
    chosen: Array,
}

/// Plain decoding of several requests at once (each without a source or
/// logits processors, decoding), pipelined as [`RequestState::decode_pipelined`]
/// decodes one: the next step's packed forward is queued on the lazily
/// sampled tokens (`Target::decode_rows`) before the current ones are read
/// back. Each step computes what a batched step computes for plain rows
/// (the pending tokens packed, each row's logits, log-probabilities and its
/// own sampler's draw), so the tokens are the same. Runs until a request
/// ends or is cancelled, one has no room for another queued token, or
/// `interrupt` answers `true` (asked before each step is queued); every
/// request still going is then left as a batched step leaves it. A failed
/// step rolls the rows back to their last emitted token, for the
/// scheduler's steps to retry (alone where a shared step fails). Returns
/// the forwards run.
pub(crate) fn decode_rows_pipelined(
    target: &dyn Target,
    states: &mut [&mut RequestState<'_>],
    interrupt: &mut dyn FnMut() -> bool,
) -> usize {
    let mut forwards = 0;
    if let Err(e) = rows_pipelined(target, states, interrupt, &mut forwards) {
        tracing::warn!(error = %e, rows = states.len(), "a pipelined step failed; its rows go back to scheduled steps");
        for state in states.iter_mut().filter(|s| !s.is_done()) {
            state.step_start = state.history.len() - 1;
            if !state.roll_back_step() {
                state.fail(ServeError::Spec(spec_core::SpecError::Internal(
                    "a pipelined step failed and this request's caches could not roll back to its last token",
                )));
            }
        }
    }
    for state in states.iter_mut().filter(|s| !s.is_done()) {
        state.round.resume_from(state.round.pending);
        state.step_start = state.caches.offset();
    }
    forwards
}

fn rows_pipelined(
    target: &dyn Target,
    states: &mut [&mut RequestState<'_>],
    interrupt: &mut dyn FnMut() -> bool,
    forwards: &mut usize,
) -> Result<(), ServeError> {
    for state in states.iter_mut() {
        state.step_start = state.caches.offset();
    }
    if interrupt() {
        return Ok(());
    }
    let pending: Vec<u32> = states.iter().map(|s| s.round.pending).collect();
    let first = Array::from_slice(&pending, &[1, pending.len() as i32]);
    let mut queued = queue_rows(target, states, &first)?;
    *forwards += 1;
    loop {
        let cancelled: Vec<bool> = states.iter().map(|s| s.is_cancelled()).collect();
        let room = states.iter().all(|s| s.sink.has_room_after_next());
        let next = if room && !cancelled.contains(&true) && !interrupt() {
            *forwards += 1;
            Some(queue_rows(target, states, &queued.ids)?)
        } else {
            None
        };
        let ended = emit_rows(states, &queued, &cancelled)?;
        match next {
            Some(n) if !ended => queued = n,
            Some(n) => {
                // A request ended with the next step queued: the others
                // take that step's tokens, then every row leaves.
                let none = vec![false; states.len()];
                emit_rows(states, &n, &none)?;
                return Ok(());
            }
            None => return Ok(()),
        }
    }
}

/// The packed forward over `ids` and each row's draw, queued.
fn queue_rows(
    target: &dyn Target,
    states: &mut [&mut RequestState<'_>],
    ids: &Array,
) -> Result<Queued, ServeError> {
    let out = {
        let mut caches: Vec<&mut spec_core::CacheSet> =
            states.iter_mut().map(|s| &mut s.caches).collect();
        // As `decode_pipelined`'s step: a failure rolls back to the last
        // emitted token.
        for c in caches.iter_mut() {
            c.commit_to(c.offset().saturating_sub(1));
        }
        target.decode_rows(ids, &mut caches)?
    };
    // Each row's log-softmax is its own (per row, as a row alone computes
    // it); one call takes them all.
    let logprobs = mlx_ext::softmax::log_softmax(&target.logits(&out.hidden)?)?;
    let mut ys = Vec::with_capacity(states.len());
    let mut chosen = Vec::with_capacity(states.len());
    // Every row is live: a step is queued only while none has ended.
    for (i, state) in states.iter_mut().enumerate() {
        let lp = logprobs.index((.., i as i32, ..));
        state.stats.record_round(0, 0);
        let y = state
            .sampler
            .sample(&lp)?
            .as_dtype(Dtype::Uint32)?
            .reshape(&[1, 1])?;
        chosen.push(lp.take_along_axis(&y, -1)?);
        ys.push(y);
    }
    let ids = mlx_rs::ops::concatenate(&ys, 1)?;
    let chosen = mlx_rs::ops::concatenate(&chosen, 1)?;
    mlx_rs::transforms::async_eval([&ids, &chosen])?;
    Ok(Queued { ids, chosen })
}

/// Reads a queued step back and emits each live row's token (a cancelled
/// row ends without it); `true` when a request ended.
fn emit_rows(
    states: &mut [&mut RequestState<'_>],
    queued: &Queued,
    cancelled: &[bool],
) -> Result<bool, ServeError> {
    mlx_rs::transforms::eval([&queued.ids, &queued.chosen])?;
    let tokens = queued.ids.as_slice::<u32>().to_vec();
    let logprobs = queued.chosen.as_slice::<f32>().to_vec();
    let mut ended = false;
    for (i, state) in states.iter_mut().enumerate() {
        if state.is_done() {
            continue;
        }
        if cancelled.get(i).copied().unwrap_or(false) {
            state.end(Finish::Cancelled);
            ended = true;
            continue;
        }
        let (token, logprob) = (tokens[i], logprobs[i]);
        if let Some(finish) = state
            .sink
            .emit(&mut state.history, token, logprob, Vec::new())
        {
            state.end(finish);
            ended = true;
        } else {
            state.round.pending = token;
        }
    }
    Ok(ended)
}
