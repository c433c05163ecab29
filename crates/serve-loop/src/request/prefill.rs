//! A request's prompt processing: where the prompt stands, how it is cut
//! into chunks (a fixed grid), how its last token runs, and the taps the
//! chunks leave for a source that reads tapped layers.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;
use spec_core::PrefillMode;

use crate::ServeError;

/// A request's prefill.
pub(super) struct Prefill {
    /// How the source wants the prompt's last token run.
    pub(super) mode: PrefillMode,
    /// Prompt tokens per chunk.
    chunk: usize,
    /// Where the prefill grid starts: 0, or a prefix-cache hit on a
    /// split-invariant target (any split gives one prefill's bits there, so
    /// the new tokens run in as few chunks as they need).
    grid_origin: usize,
    /// Prompt tokens the caches held when the request began (a prefix).
    pub(super) cached_tokens: usize,
    /// The chunks' taps, in order, until the source takes them.
    taps: Vec<Array>,
}

impl Prefill {
    /// A prefill from `start` (the tokens the caches hold) with its grid
    /// from `grid_origin`.
    pub(super) fn new(mode: PrefillMode, chunk: usize, grid_origin: usize, start: usize) -> Self {
        Self {
            mode,
            chunk,
            grid_origin,
            cached_tokens: start,
            taps: Vec::new(),
        }
    }

    /// The prefill chunk.
    pub(super) fn chunk(&self) -> usize {
        self.chunk
    }

    /// The end of the next chunk of `prompt[..body_end]` from `next`, on
    /// the grid.
    pub(super) fn chunk_end(&self, next: usize, body_end: usize) -> usize {
        let o = self.grid_origin;
        (o + (next.saturating_sub(o) / self.chunk + 1) * self.chunk).min(body_end)
    }

    /// Keeps a chunk's taps.
    pub(super) fn push_taps(&mut self, taps: Option<Array>) {
        if let Some(t) = taps {
            self.taps.push(t);
        }
    }

    /// The whole prompt's taps, taken (`None` when the source taps none).
    pub(super) fn take_taps(&mut self) -> Result<Option<Array>, ServeError> {
        let ctx = if self.taps.is_empty() {
            None
        } else {
            Some(concatenate(&self.taps, 1)?)
        };
        self.taps.clear();
        Ok(ctx)
    }

    /// Starts over from the prompt's start (no cached prefix).
    pub(super) fn restart_cold(&mut self) {
        self.cached_tokens = 0;
        self.grid_origin = 0;
        self.taps.clear();
    }
}
