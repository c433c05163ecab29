//! Plain decoding of a lone request without logits processors, pipelined as
//! mlx-lm does: the next step's forward is queued (on the lazily sampled
//! token) before the current token is read back, so the CPU never idles
//! between steps. Each step computes what a plain row of a batched step
//! computes (the pending token alone, its logits, the sampler's draw), so
//! the tokens are the same either way.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::SpecStats;

use super::{token_of, RequestState};
use crate::{Finish, ServeError};

impl RequestState<'_> {
    /// Decodes to the end of the request (a failure fails it, its caches
    /// rolled back to where the last emitted token left them).
    pub(crate) fn decode_pipelined(&mut self) {
        match self.pipelined() {
            Ok(finish) => self.end(finish),
            Err(e) => {
                // The queued step may have appended past the last emitted
                // token's row.
                self.step_start = self.history.len() - 1;
                self.fail(e);
            }
        }
    }

    fn pipelined(&mut self) -> Result<Finish, ServeError> {
        self.step_start = self.caches.offset();
        let target = self.target;
        let result = (|| {
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
            let mut stats = std::mem::take(&mut self.stats);
            let mut y = step(&Array::from_slice(&[self.pending], &[1]), &mut stats)?;
            let finish = loop {
                if self.cancelled.as_ref().is_some_and(|c| c()) {
                    mlx_rs::transforms::eval([&y.0, &y.1])?;
                    break Finish::Cancelled;
                }
                // Queue the next step before waiting on this one (unless this
                // is the last).
                let next = if self.sink.tokens.len() + 1 < self.sink.max_tokens {
                    Some(step(&y.0, &mut stats)?)
                } else {
                    None
                };
                let token = token_of(&y.0)?;
                mlx_rs::transforms::eval([&y.1])?;
                let logprob = y.1.as_slice::<f32>().first().copied().unwrap_or(f32::NAN);
                if let Some(finish) = self.sink.emit(&mut self.history, token, logprob) {
                    // Never leave the queued step running behind our back: a
                    // process that exits while MLX still computes on its
                    // stream thread can deadlock in OpenBLAS's shutdown or
                    // corrupt the heap (seen).
                    if let Some((n, c)) = &next {
                        mlx_rs::transforms::eval([n, c])?;
                    }
                    break finish;
                }
                self.pending = token;
                match next {
                    Some(n) => y = n,
                    None => break Finish::MaxTokens,
                }
            };
            self.stats = stats;
            Ok(finish)
        })();
        result
    }
}
