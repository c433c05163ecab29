//! Plain decoding of a lone request without logits processors, pipelined as
//! mlx-lm does: the next step's forward is queued (on the lazily sampled
//! token) before the current token is read back, so the CPU never idles
//! between steps. Each step computes what a plain row of a batched step
//! computes (the pending token alone, its logits, the sampler's draw), so
//! the tokens are the same either way. `generate` runs it to the end; the
//! engine runs it while the request is alone and stops it (between two
//! tokens, in the state a batched step leaves) when something else needs a
//! step.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::SpecStats;

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
                self.feed = vec![self.pending];
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
        let mut y = step(&Array::from_slice(&[self.pending], &[1]), stats)?;
        loop {
            if self.cancelled.as_ref().is_some_and(|c| c()) {
                mlx_rs::transforms::eval([&y.0, &y.1])?;
                return Ok(Some(Finish::Cancelled));
            }
            // Queue the next step before waiting on this one, unless this is
            // the last token or the request must stop after it.
            let next = if self.sink.tokens.len() + 1 < self.sink.max_tokens && !interrupt() {
                Some(step(&y.0, stats)?)
            } else {
                None
            };
            let token = token_of(&y.0)?;
            mlx_rs::transforms::eval([&y.1])?;
            let logprob = y.1.as_slice::<f32>().first().copied().unwrap_or(f32::NAN);
            if let Some(finish) = self.sink.emit(&mut self.history, token, logprob) {
                // Never leave the queued step running behind our back: a
                // process that exits while MLX still computes on its stream
                // thread can deadlock in OpenBLAS's shutdown or corrupt the
                // heap (seen).
                if let Some((n, c)) = &next {
                    mlx_rs::transforms::eval([n, c])?;
                }
                return Ok(Some(finish));
            }
            self.pending = token;
            match next {
                Some(n) => y = n,
                // Not the last token (that one finished above): interrupted.
                None => return Ok(None),
            }
        }
    }
}
