//! One request as a state machine advanced one step at a time: `plan`
//! (before the step's shared target forward: cancellation, draft length,
//! drafting, the row's window) and `absorb` (after it: verification,
//! rollback by the row's own rejected count, commit, emission, finish).
//! Prefill and decoding are phases of the same machine.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::time::Instant;

use crate::prefix_cache::{Boundaries, PrefixCache, SavedDrafts};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{
    BatchRow, CacheSet, CommitInfo, Draft, DraftRequest, DraftSource, LogitsProcessor, PrefillMode,
    RequestOutcome, RowForm, Sampler, SpecError, SpecStats, Target,
};
use std::rc::Rc;

use crate::reuse::{Grid, Reuse};
use crate::types::{Finish, Output, Speculation};
use crate::verify::{judge, sample, Verdict};

mod pipelined;
use crate::{DraftController, ServeError, SpecConfig, VerifyMode};
pub(crate) use pipelined::decode_rows_pipelined;

/// Called with each emitted token and its log-probability; `Break` stops
/// the request ([`Finish::Stopped`]).
pub(crate) type TokenHook<'a> = Box<dyn FnMut(u32, f32) -> ControlFlow<()> + 'a>;

/// The logits processors of a request, borrowed from the caller or owned.
pub(crate) enum Processors<'a> {
    /// Held by the caller of [`crate::generate`].
    Borrowed(&'a mut [Box<dyn LogitsProcessor>]),
    /// Handed over with the request.
    Owned(Vec<Box<dyn LogitsProcessor>>),
}

impl Processors<'_> {
    fn get(&mut self) -> &mut [Box<dyn LogitsProcessor>] {
        match self {
            Processors::Borrowed(p) => p,
            Processors::Owned(p) => p,
        }
    }
    fn is_empty(&self) -> bool {
        match self {
            Processors::Borrowed(p) => p.is_empty(),
            Processors::Owned(p) => p.is_empty(),
        }
    }
}

/// A borrowed sampler used as an owned one.
pub(crate) struct SamplerRef<'a>(pub(crate) &'a mut dyn Sampler);

impl Sampler for SamplerRef<'_> {
    fn sample(&mut self, logprobs: &Array) -> Result<Array, SpecError> {
        self.0.sample(logprobs)
    }
    fn is_greedy(&self) -> bool {
        self.0.is_greedy()
    }
    fn probabilities(&self, logprobs: &Array) -> Result<Array, SpecError> {
        self.0.probabilities(logprobs)
    }
}

/// Everything a request brings, borrowed or owned.
pub(crate) struct Parts<'a, 'p> {
    pub(crate) prompt: Cow<'a, [u32]>,
    pub(crate) max_tokens: usize,
    pub(crate) is_eos: Box<dyn Fn(u32) -> bool + 'a>,
    pub(crate) sampler: Box<dyn Sampler + 'a>,
    pub(crate) processors: Processors<'a>,
    /// The provider only opens the source: it may live shorter than the
    /// request (sources never borrow it).
    pub(crate) speculation: Option<Speculation<'p>>,
    pub(crate) cancelled: Option<Box<dyn Fn() -> bool + 'a>>,
    pub(crate) tenant: Option<String>,
    pub(crate) cache_salt: Option<String>,
    pub(crate) on_token: TokenHook<'a>,
    /// Caches already holding `prompt[..offset]`: prefill starts there.
    pub(crate) prefix: Option<CacheSet>,
}

/// Which positions of a row's window need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// None (a prompt chunk).
    None,
    /// The last one (a full prefill's last prompt token).
    Last,
    /// Every one (a verify window).
    All,
}

/// A row's window for the step's shared forward.
#[derive(Debug)]
pub(crate) struct Window {
    pub(crate) tokens: Vec<u32>,
    pub(crate) form: RowForm,
    pub(crate) wanted: Wanted,
}

/// What a request needs from the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// A prompt row of this many tokens.
    Prefill(usize),
    /// A verify window (or a finish found while planning it).
    Decode,
    /// Nothing: the request has ended.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `prompt[next..len-1]` still to prefill.
    Prefill {
        next: usize,
    },
    /// A full prefill's last prompt token, run alone.
    Last,
    Decode,
    Done,
}

/// A round's drafts, kept from `plan` to `absorb`.
struct Round {
    draft: Draft,
    n: usize,
}

/// One request's whole state.
pub(crate) struct RequestState<'a> {
    target: &'a dyn Target,
    prompt: Cow<'a, [u32]>,
    sink: Sink<'a>,
    pub(crate) sampler: Box<dyn Sampler + 'a>,
    processors: Processors<'a>,
    cancelled: Option<Box<dyn Fn() -> bool + 'a>>,
    provider: Option<String>,
    source: Option<Box<dyn DraftSource + 'a>>,
    retired: Option<Box<dyn DraftSource + 'a>>,
    mode: PrefillMode,
    chunk: usize,
    /// Where the prefill grid starts: 0, or a prefix-cache hit on a
    /// split-invariant target (any split gives one prefill's bits there, so
    /// the new tokens run in as few chunks as they need).
    grid_origin: usize,
    controller: DraftController,
    rejection: bool,
    rng: StdRng,
    pub(crate) stats: SpecStats,
    pub(crate) caches: CacheSet,
    pub(crate) history: Vec<u32>,
    phase: Phase,
    pub(crate) pending: u32,
    feed: Vec<u32>,
    anchor: Option<Array>,
    prefill_taps: Vec<Array>,
    round: Option<Round>,
    window: Option<Window>,
    /// The caches' offset before this step: a failed step rolls back here.
    step_start: usize,
    /// Prompt tokens the caches held when the request began (a prefix).
    cached_tokens: usize,
    /// The prefix cache's bookkeeping.
    reuse: Reuse,
    pub(crate) finish: Option<Finish>,
    error: Option<ServeError>,
    started: Option<Instant>,
    prompt_seconds: f64,
    gen_start: Option<Instant>,
}

/// Where emitted tokens go: the output, the host's hook, and the checks
/// that end a request on a token.
struct Sink<'a> {
    is_eos: Box<dyn Fn(u32) -> bool + 'a>,
    on_token: TokenHook<'a>,
    max_tokens: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    first_token: Option<Instant>,
}

impl Sink<'_> {
    /// Emits `token` unless it ends the request (it joins `history` too);
    /// returns how the request ends, if it does.
    fn emit(&mut self, history: &mut Vec<u32>, token: u32, logprob: f32) -> Option<Finish> {
        if (self.is_eos)(token) {
            return Some(Finish::Eos);
        }
        self.first_token.get_or_insert_with(Instant::now);
        self.tokens.push(token);
        self.logprobs.push(logprob);
        history.push(token);
        if (self.on_token)(token, logprob).is_break() {
            return Some(Finish::Stopped);
        }
        if self.tokens.len() >= self.max_tokens {
            return Some(Finish::MaxTokens);
        }
        None
    }
}

/// Rolls every cache back to `offset`, the start of a step that failed (a
/// forward may have appended to some caches and not others; a failed trim
/// may have trimmed some), as far as each cache can.
pub(crate) fn roll_back(caches: &mut CacheSet, offset: usize) {
    for i in 0..caches.len() {
        if let Some(cache) = caches.get_mut(i) {
            let extra = cache.offset().saturating_sub(offset);
            if extra > 0 {
                if let Err(e) = cache.trim(extra) {
                    tracing::warn!(cache = i, error = %e, "a failed step's cache could not be rolled back");
                }
            }
        }
    }
}

pub(crate) fn token_of(a: &Array) -> Result<u32, ServeError> {
    let a = a.as_dtype(Dtype::Uint32)?;
    a.eval()?;
    a.as_slice::<u32>()
        .first()
        .copied()
        .ok_or_else(|| ServeError::Spec(SpecError::Internal("sampler returned no token")))
}

/// Log-probabilities of `logits` (`[1, V]`) after the processors.
fn logprobs(
    logits: &Array,
    history: &[u32],
    processors: &mut [Box<dyn LogitsProcessor>],
) -> Result<Array, ServeError> {
    let mut row = logits.clone();
    for p in processors.iter_mut() {
        row = p.process(history, &row)?;
    }
    Ok(mlx_ext::softmax::log_softmax(&row)?)
}

fn host_probs(probs: &Array) -> Result<Vec<f32>, ServeError> {
    let p = probs.as_dtype(Dtype::Float32)?;
    p.eval()?;
    Ok(p.as_slice::<f32>().to_vec())
}

/// `logprobs[token]` of a `[1, V]` row, read back.
fn chosen_logprob(lp: &Array, token: u32) -> Result<f32, ServeError> {
    let v = lp.take_along_axis(Array::from_slice(&[token], &[1, 1]), -1)?;
    v.eval()?;
    v.as_slice::<f32>()
        .first()
        .copied()
        .ok_or_else(|| ServeError::Spec(SpecError::Internal("no log-probability")))
}

impl<'a> RequestState<'a> {
    /// Opens the request's source and sets up its state. `chunk` is the
    /// prefill chunk (a fixed grid from the prompt's start).
    /// With `reuse`, a request that brings no prefix of its own starts from
    /// the longest usable cached prefix, and keeps snapshots of its caches
    /// at its exact boundaries for [`RequestState::take_entries`].
    pub(crate) fn new(
        target: &'a dyn Target,
        parts: Parts<'a, '_>,
        chunk: usize,
        reuse: Option<&mut PrefixCache>,
    ) -> Result<Self, ServeError> {
        let Parts {
            prompt,
            max_tokens,
            is_eos,
            sampler,
            processors,
            speculation,
            cancelled,
            tenant,
            cache_salt,
            on_token,
            prefix,
        } = parts;
        if prompt.is_empty() {
            return Err(ServeError::EmptyPrompt);
        }
        if chunk == 0 {
            return Err(ServeError::Config(
                "the prefill chunk must hold at least one token".into(),
            ));
        }
        let own_prefix = prefix.is_some();
        let partition = crate::prefix_cache::cache_partition(
            tenant.as_deref(),
            cache_salt.as_deref(),
            reuse.as_ref().is_some_and(|c| c.config().share_tenants),
        );
        let (source, config, provider, state_key) = match &speculation {
            Some(s) => {
                let context = spec_core::OpenContext { tenant };
                let source = s
                    .provider
                    .open_with(target, &context)
                    .map_err(|e| ServeError::source(s.provider.id(), e))?;
                (
                    Some(source),
                    s.config.clone(),
                    Some(s.provider.id().to_string()),
                    Some(crate::prefix_cache::state_key(s.provider)),
                )
            }
            None => (None, SpecConfig::default(), None, None),
        };
        let taps = source.as_ref().is_some_and(|s| !s.tap_layers().is_empty());
        let rule = Boundaries::of(target, chunk);
        // A source that reads tapped layers needs every prompt position's
        // taps: it starts from a cached prefix only within what a saved
        // state of its own covers (and starts over cold if it declines it).
        let reuse = reuse.filter(|_| !own_prefix);
        let keep_snapshots = reuse.is_some();
        let mut restore = None;
        let caches = match (prefix, reuse) {
            (Some(p), _) => p,
            (None, Some(cache)) => {
                let state_of = state_key.as_deref().filter(|_| taps);
                match cache.lookup_in(&partition, &prompt, rule, state_of) {
                    Some(hit) => {
                        restore = state_key.as_deref().and_then(|key| {
                            let (_, saved) = hit.drafts.iter().find(|(p, _)| p == key)?;
                            Some((Rc::clone(saved), hit.tokens.min(saved.tokens())))
                        });
                        hit.caches
                    }
                    None => target.make_caches(),
                }
            }
            (None, None) => target.make_caches(),
        };
        let start = caches.offset();
        if start >= prompt.len() {
            return Err(ServeError::PrefixTooLong {
                cached: start,
                prompt: prompt.len(),
            });
        }
        if own_prefix && start > 0 && taps {
            return Err(ServeError::PrefixWithTaps {
                provider: provider.clone().unwrap_or_default(),
            });
        }
        let grid_origin = if !own_prefix && rule == Boundaries::Any {
            start
        } else {
            0
        };
        let mode = source
            .as_ref()
            .map_or(PrefillMode::TailSplit, |s| s.prefill_mode());
        let rejection = config.verify == VerifyMode::Rejection && !sampler.is_greedy();
        let pending = prompt[prompt.len() - 1];
        let prompt_len = prompt.len();
        Ok(Self {
            target,
            history: prompt.to_vec(),
            prompt,
            sink: Sink {
                is_eos,
                on_token,
                max_tokens,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                first_token: None,
            },
            sampler,
            processors,
            cancelled,
            provider,
            source,
            retired: None,
            mode,
            chunk,
            grid_origin,
            controller: DraftController::new(config.num_draft, config.adaptive.clone()),
            rejection,
            rng: StdRng::seed_from_u64(config.seed),
            stats: SpecStats::default(),
            caches,
            phase: Phase::Prefill { next: start },
            pending,
            feed: vec![pending],
            anchor: None,
            prefill_taps: Vec::new(),
            round: None,
            window: None,
            step_start: start,
            cached_tokens: start,
            reuse: Reuse::new(
                rule,
                keep_snapshots,
                &Grid {
                    prompt_len,
                    chunk,
                    start,
                    origin: grid_origin,
                },
                partition,
                state_key,
                restore,
            ),
            finish: None,
            error: None,
            started: None,
            prompt_seconds: 0.0,
            gen_start: None,
        })
    }

    /// The prefix cache's partition this request reads and fills.
    pub(crate) fn partition(&self) -> &str {
        &self.reuse.partition
    }

    /// Whether the source started from a prefix-cache entry's saved state.
    pub(crate) fn draft_restored(&self) -> bool {
        self.reuse.draft_restored
    }

    /// What the request leaves to the prefix cache ([`Reuse::take_entries`]).
    /// Takes the caches: call it only as the request ends. The entries
    /// belong to [`RequestState::partition`].
    pub(crate) fn take_entries(&mut self) -> (Vec<(Vec<u32>, CacheSet, SavedDrafts)>, Boundaries) {
        self.reuse.take_entries(
            self.error.is_some(),
            &mut self.caches,
            &self.prompt,
            &self.history,
        )
    }

    /// When the request first took part in a step.
    pub(crate) fn started_at(&self) -> Option<Instant> {
        self.started
    }

    /// When the first token was emitted.
    pub(crate) fn first_token_at(&self) -> Option<Instant> {
        self.sink.first_token
    }

    /// Whether the request is plain (no source, no processors) and decoding.
    pub(crate) fn plain_decoding(&self) -> bool {
        self.phase == Phase::Decode
            && self.source.is_none()
            && self.retired.is_none()
            && self.processors.is_empty()
            && self.finish.is_none()
            && self.sink.tokens.len() < self.sink.max_tokens
    }

    /// The decoder layers this request's source taps (none when plain).
    pub(crate) fn taps(&self) -> &[usize] {
        self.source.as_ref().map_or(&[], |s| s.tap_layers())
    }

    fn body_end(&self) -> usize {
        self.prompt.len() - 1
    }

    /// The next chunk of `prompt[..len-1]` from `next`, on the grid.
    fn chunk_end(&self, next: usize) -> usize {
        let o = self.grid_origin;
        (o + (next.saturating_sub(o) / self.chunk + 1) * self.chunk).min(self.body_end())
    }

    /// What the next step must give this request.
    pub(crate) fn need(&self) -> Need {
        match self.phase {
            Phase::Done => Need::Done,
            Phase::Prefill { next } if next < self.body_end() => {
                Need::Prefill(self.chunk_end(next) - next)
            }
            Phase::Prefill { .. } if self.mode == PrefillMode::Full => Need::Prefill(1),
            Phase::Last => Need::Prefill(1),
            Phase::Prefill { .. } | Phase::Decode => Need::Decode,
        }
    }

    /// Ends the request (no row this step) when it was cancelled.
    pub(crate) fn poll_cancel(&mut self) {
        if self.phase != Phase::Done && self.cancelled.as_ref().is_some_and(|c| c()) {
            self.end(Finish::Cancelled);
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.as_ref().is_some_and(|c| c())
    }

    fn end(&mut self, finish: Finish) {
        self.finish = Some(finish);
        self.phase = Phase::Done;
        self.window = None;
        self.round = None;
    }

    /// Fails the request: caches back at the step's start, the error kept
    /// for [`RequestState::close`].
    pub(crate) fn fail(&mut self, error: ServeError) {
        roll_back(&mut self.caches, self.step_start);
        self.error = Some(error);
        self.phase = Phase::Done;
        self.window = None;
        self.round = None;
    }

    /// Caches back at the step's start (a shared forward failed; the row is
    /// retried alone).
    pub(crate) fn roll_back_step(&mut self) {
        roll_back(&mut self.caches, self.step_start);
    }

    pub(crate) fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Plans this step's row; `false` when the request ended (or failed)
    /// while planning and has no row.
    pub(crate) fn plan(&mut self) -> bool {
        self.started.get_or_insert_with(Instant::now);
        self.step_start = self.caches.offset();
        match self.plan_inner() {
            Ok(Some(window)) => {
                self.window = Some(window);
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    fn plan_inner(&mut self) -> Result<Option<Window>, ServeError> {
        if let Phase::Prefill { next } = self.phase {
            if next < self.body_end() {
                let end = self.chunk_end(next);
                return Ok(Some(Window {
                    tokens: self.prompt[next..end].to_vec(),
                    form: RowForm::Prefill,
                    wanted: Wanted::None,
                }));
            }
            if self.mode == PrefillMode::Full {
                self.phase = Phase::Last;
            } else {
                self.finish_prefill()?;
                if let Phase::Prefill { .. } = self.phase {
                    return self.plan_inner();
                }
            }
        }
        match self.phase {
            Phase::Last => Ok(Some(Window {
                tokens: vec![self.prompt[self.body_end()]],
                form: RowForm::Prefill,
                wanted: Wanted::Last,
            })),
            Phase::Decode => self.plan_round(),
            Phase::Prefill { .. } | Phase::Done => Ok(None),
        }
    }

    /// Hands the prompt (and its taps) to the source; decoding starts,
    /// unless a source that reads tapped layers declined the saved state of
    /// a prefix cache hit: it has no taps of the cached part, so the
    /// request starts over cold (the phase is then `Prefill` again).
    fn finish_prefill(&mut self) -> Result<(), ServeError> {
        let ctx = if self.prefill_taps.is_empty() {
            None
        } else {
            Some(concatenate(&self.prefill_taps, 1)?)
        };
        self.prefill_taps.clear();
        let start = self.cached_tokens;
        if let Some(src) = self.source.as_mut() {
            let taps = !src.tap_layers().is_empty();
            let named = |e| ServeError::source(self.provider.as_deref().unwrap_or("?"), e);
            let restored = match self.reuse.restore.take() {
                Some((saved, keep)) if !taps || keep == start => src
                    .prefill_from(saved.as_ref(), keep, &self.prompt, ctx.as_ref())
                    .map_err(named)?,
                _ => false,
            };
            self.reuse.draft_restored = restored;
            if !restored && taps && start > 0 {
                self.restart_cold();
                return Ok(());
            }
            if !restored {
                src.prefill(&self.prompt, ctx.as_ref()).map_err(named)?;
            }
            if self.reuse.wants_saved_draft() {
                self.reuse.set_saved_draft(src.save_prefill().map(Rc::from));
            }
        }
        self.phase = Phase::Decode;
        Ok(())
    }

    /// Drops the cached prefix and prefills from the prompt's start.
    fn restart_cold(&mut self) {
        tracing::debug!(
            provider = self.provider.as_deref(),
            cached = self.cached_tokens,
            "the source declined its saved state: prefilling cold"
        );
        self.caches = self.target.make_caches();
        self.step_start = 0;
        self.cached_tokens = 0;
        self.anchor = None;
        self.phase = Phase::Prefill { next: 0 };
        self.grid_origin = 0;
        self.reuse.restart_cold(self.prompt.len(), self.chunk);
    }

    fn start_generation(&mut self) {
        if self.gen_start.is_none() {
            self.prompt_seconds = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
            self.gen_start = Some(Instant::now());
        }
    }

    fn plan_round(&mut self) -> Result<Option<Window>, ServeError> {
        self.start_generation();
        if self.sink.tokens.len() >= self.sink.max_tokens {
            self.end(Finish::MaxTokens);
            return Ok(None);
        }
        if self.is_cancelled() {
            self.end(Finish::Cancelled);
            return Ok(None);
        }
        let remaining = self.sink.max_tokens - self.sink.tokens.len();
        let mut n = match self.source.as_ref() {
            Some(src) if src.drafts_past_max_tokens() => self.controller.next_len(),
            Some(_) => self.controller.next_len().min(remaining),
            None => 0,
        };
        if n > 0 && !self.caches.can_trim_after(n + 1, n) {
            // Near a sliding window's end: draft only as far as the caches
            // can still roll back. Once a window has rotated nothing can be
            // rolled back: decode plainly from here.
            n = (1..n)
                .rev()
                .find(|&m| self.caches.can_trim_after(m + 1, m))
                .unwrap_or(0);
            if n == 0 {
                self.stats.untrimmable_fallback = true;
                self.retired = self.source.take();
            }
        }
        let draft = match self.source.as_mut() {
            Some(src) if n > 0 => src
                .draft(
                    DraftRequest {
                        feed: &self.feed,
                        max_tokens: n,
                        anchor_hidden: self.anchor.as_ref(),
                        history: &self.history,
                        target_caches: Some(&self.caches),
                    },
                    self.sampler.as_mut(),
                )
                .map_err(|e| ServeError::source(self.provider.as_deref().unwrap_or("?"), e))?,
            _ => Draft::default(),
        };
        let d = draft.tokens.len();
        if d > n {
            return Err(ServeError::source(
                self.provider.as_deref().unwrap_or("?"),
                SpecError::Protocol(format!("source returned {d} drafts for at most {n}")),
            ));
        }
        let mut tokens = Vec::with_capacity(d + 1);
        tokens.push(self.pending);
        tokens.extend_from_slice(&draft.tokens);
        self.round = Some(Round { draft, n });
        Ok(Some(Window {
            tokens,
            form: RowForm::Decode,
            wanted: Wanted::All,
        }))
    }

    /// The planned window, if any.
    pub(crate) fn window(&self) -> Option<&Window> {
        self.window.as_ref()
    }

    /// The row of the shared forward: the planned window over this
    /// request's caches.
    pub(crate) fn batch_row(&mut self) -> Option<BatchRow<'_>> {
        let window = self.window.as_ref()?;
        Some(BatchRow {
            tokens: &window.tokens,
            caches: &mut self.caches,
            form: window.form,
        })
    }

    /// Takes the step's results for this row: its hidden states, its
    /// source's taps (its own columns, its own order) and the logits of the
    /// positions it wanted. A failure rolls the caches back and fails the
    /// request.
    pub(crate) fn absorb(&mut self, hidden: &Array, taps: Option<Array>, logits: Option<&Array>) {
        let Some(window) = self.window.take() else {
            return;
        };
        if let Err(e) = self.absorb_inner(&window, hidden, taps, logits) {
            self.fail(e);
        }
    }

    fn absorb_inner(
        &mut self,
        window: &Window,
        hidden: &Array,
        taps: Option<Array>,
        logits: Option<&Array>,
    ) -> Result<(), ServeError> {
        let missing = || ServeError::Spec(SpecError::Internal("the step returned no logits"));
        match self.phase {
            Phase::Prefill { next } => {
                self.anchor = Some(hidden.index((.., -1.., ..)));
                if let Some(t) = taps {
                    self.prefill_taps.push(t);
                }
                let next = next + window.tokens.len();
                self.phase = Phase::Prefill { next };
                self.reuse
                    .after_chunk(next, &self.caches, self.sink.max_tokens);
                Ok(())
            }
            Phase::Last => {
                self.anchor = Some(hidden.index((.., -1.., ..)));
                if let Some(t) = taps {
                    self.prefill_taps.push(t);
                }
                self.finish_prefill()?;
                if self.phase != Phase::Decode {
                    return Ok(());
                }
                self.start_generation();
                let logits = logits.ok_or_else(missing)?;
                let lp = logprobs(
                    &logits.index((.., -1, ..)),
                    &self.history,
                    self.processors.get(),
                )?;
                let first = token_of(&self.sampler.sample(&lp)?)?;
                let logprob = chosen_logprob(&lp, first)?;
                self.pending = first;
                self.feed = vec![first];
                if let Some(finish) = self.emit(first, logprob) {
                    self.end(finish);
                }
                Ok(())
            }
            Phase::Decode => {
                let logits = logits.ok_or_else(missing)?;
                self.verify(hidden, taps.as_ref(), logits)
            }
            Phase::Done => Ok(()),
        }
    }

    /// Verification of a round's window, position by position, as one
    /// request alone does it.
    fn verify(
        &mut self,
        hidden: &Array,
        taps: Option<&Array>,
        logits: &Array,
    ) -> Result<(), ServeError> {
        let Round { draft, n } = self.round.take().ok_or_else(|| {
            ServeError::Spec(SpecError::Internal("a verify window without a round"))
        })?;
        let d = draft.tokens.len();
        let mut accepted = 0;
        let mut next = None;
        let mut walked = Vec::with_capacity(d + 1);
        let draft_probs = match (&draft.probs, self.rejection) {
            (Some(q), true) => Some(host_probs(q)?),
            _ => None,
        };
        let vocab = logits.shape().last().copied().unwrap_or(0) as usize;
        // What the processors see at position i: the history, then drafts[..i].
        let mut hist = self.history.clone();
        for i in 0..=d {
            if i > 0 {
                hist.push(draft.tokens[i - 1]);
            }
            let lp = logprobs(
                &logits.index((.., i as i32, ..)),
                &hist,
                self.processors.get(),
            )?;
            let t = if self.rejection {
                let p = host_probs(&self.sampler.probabilities(&lp)?)?;
                if i == d {
                    sample(&p, &mut self.rng)
                } else {
                    let q = draft_probs.as_ref().map(|q| &q[i * vocab..(i + 1) * vocab]);
                    match judge(&p, q, draft.tokens[i], &mut self.rng) {
                        Verdict::Accept => draft.tokens[i],
                        Verdict::Replace(t) => t,
                    }
                }
            } else {
                token_of(&self.sampler.sample(&lp)?)?
            };
            walked.push(chosen_logprob(&lp, t)?);
            if i < d && t == draft.tokens[i] {
                accepted += 1;
            } else {
                next = Some(t);
                break;
            }
        }
        let next = next.ok_or_else(|| {
            ServeError::Spec(SpecError::Internal("verification produced no token"))
        })?;
        self.stats.record_round(d, accepted);
        if accepted < d {
            self.caches.trim(d - accepted)?;
        }
        if let Some(src) = self.source.as_mut() {
            if d > 0 || n > 0 {
                src.commit(CommitInfo {
                    drafted: d,
                    accepted,
                    accepted_tokens: &draft.tokens[..accepted],
                    next,
                    verified_taps: taps,
                    verified_hidden: hidden,
                })
                .map_err(|e| ServeError::source(self.provider.as_deref().unwrap_or("?"), e))?;
            }
        }
        self.controller.observe(d, accepted);
        self.anchor = Some(hidden.index((.., accepted as i32..accepted as i32 + 1, ..)));
        for (&t, &logprob) in draft.tokens[..accepted]
            .iter()
            .chain(std::iter::once(&next))
            .zip(&walked)
        {
            if let Some(finish) = self.emit(t, logprob) {
                self.end(finish);
                break;
            }
        }
        self.pending = next;
        self.feed = if d > 0 && accepted == d {
            vec![draft.tokens[d - 1], next]
        } else {
            vec![next]
        };
        Ok(())
    }

    fn emit(&mut self, token: u32, logprob: f32) -> Option<Finish> {
        self.sink.emit(&mut self.history, token, logprob)
    }

    /// Ends the request: its source is told how it ended (exactly once:
    /// this consumes the state), and the output or the error comes back.
    pub(crate) fn close(mut self) -> Result<Output, ServeError> {
        if self.phase != Phase::Done && self.error.is_none() {
            // Closed before it ended (the host shut down): a cancellation.
            self.end(Finish::Cancelled);
        }
        let outcome = match (&self.error, self.finish) {
            (Some(_), _) => RequestOutcome::Failed,
            (None, Some(Finish::Cancelled)) => RequestOutcome::Cancelled,
            (None, _) => RequestOutcome::Completed,
        };
        if let Some(src) = self.source.as_mut().or(self.retired.as_mut()) {
            src.finish(outcome);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.stats.emitted = self.sink.tokens.len();
        self.stats.paused = self.controller.paused();
        let stats = self.stats.clone();
        tracing::info!(
            provider = self.provider.as_deref(),
            drafted = stats.drafted,
            accepted = stats.accepted,
            rejected = stats.rejected,
            target_calls = stats.target_calls,
            rounds = stats.rounds,
            tokens_per_forward = stats.tokens_per_forward(),
            "speculation stats"
        );
        Ok(Output {
            tokens: std::mem::take(&mut self.sink.tokens),
            logprobs: std::mem::take(&mut self.sink.logprobs),
            finish: self.finish.unwrap_or(Finish::MaxTokens),
            stats,
            prompt_seconds: self.prompt_seconds,
            cached_tokens: self.cached_tokens,
            generation_seconds: self.gen_start.map_or(0.0, |g| g.elapsed().as_secs_f64()),
        })
    }
}
