//! Where a request's emitted tokens go: the output (tokens, their
//! log-probabilities, the times), the host's hook that streams them, and
//! the checks that end a request on a token (EOS, a stop, max tokens).

use std::ops::ControlFlow;
use std::time::Instant;

use super::TokenHook;
use crate::{Emitted, Finish, OwnHook};

/// A request's output side.
pub(super) struct Sink<'a> {
    /// Tokens that end the request.
    eos: Vec<u32>,
    /// The request's own hook, called first.
    own: Option<OwnHook>,
    /// The runner's callback or stream.
    on_token: TokenHook<'a>,
    max_tokens: usize,
    pub(super) tokens: Vec<u32>,
    pub(super) logprobs: Vec<f32>,
    pub(super) top_logprobs: Vec<Vec<(u32, f32)>>,
    /// When the request first took part in a step.
    pub(super) started: Option<Instant>,
    /// When the first token was emitted.
    pub(super) first_token: Option<Instant>,
    /// Seconds from `started` until the first token was known.
    pub(super) prompt_seconds: f64,
    /// When generation (after the prompt) began.
    gen_start: Option<Instant>,
}

impl<'a> Sink<'a> {
    pub(super) fn new(
        eos: Vec<u32>,
        own: Option<OwnHook>,
        on_token: TokenHook<'a>,
        max_tokens: usize,
    ) -> Self {
        Self {
            eos,
            own,
            on_token,
            max_tokens,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            started: None,
            first_token: None,
            prompt_seconds: 0.0,
            gen_start: None,
        }
    }

    /// The most tokens the request emits.
    pub(super) fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens still to emit before `max_tokens`.
    pub(super) fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.tokens.len())
    }

    /// Whether `max_tokens` are out.
    pub(super) fn is_full(&self) -> bool {
        self.tokens.len() >= self.max_tokens
    }

    /// Whether another token fits after the next one (a queued step may
    /// follow it).
    pub(super) fn has_room_after_next(&self) -> bool {
        self.tokens.len() + 1 < self.max_tokens
    }

    /// Notes the request's first step.
    pub(super) fn start(&mut self) {
        self.started.get_or_insert_with(Instant::now);
    }

    /// Notes the end of prompt processing (the first call counts).
    pub(super) fn start_generation(&mut self) {
        if self.gen_start.is_none() {
            self.prompt_seconds = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
            self.gen_start = Some(Instant::now());
        }
    }

    /// Seconds of generation so far.
    pub(super) fn generation_seconds(&self) -> f64 {
        self.gen_start.map_or(0.0, |g| g.elapsed().as_secs_f64())
    }

    /// Whether `token` ends the request (never emitted).
    pub(super) fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }

    /// Emits `token` (with its log-probability and the most likely tokens
    /// at its position) unless it ends the request (it joins `history`
    /// too); returns how the request ends, if it does.
    pub(super) fn emit(
        &mut self,
        history: &mut Vec<u32>,
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    ) -> Option<Finish> {
        if self.eos.contains(&token) {
            return Some(Finish::Eos);
        }
        self.first_token.get_or_insert_with(Instant::now);
        self.tokens.push(token);
        self.logprobs.push(logprob);
        history.push(token);
        let emitted = Emitted {
            token,
            logprob,
            top_logprobs: &top,
        };
        // Both hear the token, whatever the first answers.
        let own = self
            .own
            .as_mut()
            .map_or(ControlFlow::Continue(()), |f| f(&emitted));
        let runner = (self.on_token)(&emitted);
        self.top_logprobs.push(top);
        if runner.is_break() || own.is_break() {
            return Some(Finish::Stopped);
        }
        if self.is_full() {
            return Some(Finish::MaxTokens);
        }
        None
    }
}
