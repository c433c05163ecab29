//! One request as a state machine advanced one step at a time: `plan`
//! (before the step's shared target forward: cancellation, draft length,
//! drafting, the row's window) and `absorb` (after it: verification,
//! rollback by the row's own rejected count, commit, emission, finish).
//! Prefill and decoding are phases of the same machine; the state is split
//! by concern: [`prefill`] (the prompt's chunks), [`round`] (the source,
//! drafting and verification), [`crate::reuse`] (the prefix cache's
//! bookkeeping) and [`sink`] (emitted tokens, stops, streaming, times).

use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{
    BatchRow, CacheSet, DraftProvider, LogitsProcessor, PrefillMode, RequestOutcome, RowForm,
    Sampler, SpecError, SpecStats, Target, TokenMask,
};

use crate::prefix_cache::{Boundaries, PrefixCache, PrefixCacheConfig};
use crate::reuse::{Entry, Grid, Reuse};
use crate::types::{Emitted, Finish, Output, Request};
use crate::{ServeError, SpecConfig, VerifyMode};

mod constrained;
mod pipelined;
mod prefill;
mod prompt_scores;
mod round;
mod share;
mod sink;

#[cfg(test)]
mod no_rollback_tests;
#[cfg(test)]
mod round_tests;

use constrained::Constrained;
pub(crate) use pipelined::decode_rows_pipelined;
use prefill::Prefill;
use prompt_scores::PromptScores;
use round::{Round, Walked};
pub(crate) use share::Offer;
use sink::Sink;

/// Called with each emitted token and its log-probability (the runner's
/// callback or stream); `Break` stops the request ([`Finish::Stopped`]).
pub(crate) type TokenHook<'a> = Box<dyn FnMut(&Emitted<'_>) -> ControlFlow<()> + 'a>;

/// The processors a request applies to its logits.
pub(crate) type Processors = Vec<Box<dyn LogitsProcessor + Send>>;

/// The provider `request` speculates with, among `providers` (by id);
/// `None` when it decodes plainly. A request that names no provider there,
/// or gives options (nothing builds providers here), is refused.
pub(crate) fn chosen<'p>(
    request: &Request,
    providers: &[&'p dyn DraftProvider],
) -> Result<Option<&'p dyn DraftProvider>, ServeError> {
    let Some(choice) = &request.speculation else {
        return Ok(None);
    };
    if !choice.options.is_empty() {
        return Err(ServeError::Config(format!(
            "provider `{}` was given options, and nothing here builds providers",
            choice.id
        )));
    }
    match providers.iter().find(|p| p.id() == choice.id) {
        Some(p) => Ok(Some(*p)),
        None => Err(ServeError::NoSuchProvider {
            id: choice.id.clone(),
            loaded: providers
                .iter()
                .map(|p| p.id())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
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

/// One request's whole state: the machine's phase and the target's caches,
/// with its prefill, its rounds, its prefix-cache bookkeeping and its
/// output each in a part of their own.
pub(crate) struct RequestState<'a> {
    target: &'a dyn Target,
    prompt: Vec<u32>,
    /// The prompt, then every emitted token.
    pub(crate) history: Vec<u32>,
    pub(crate) caches: CacheSet,
    pub(crate) sampler: Box<dyn Sampler>,
    processors: Processors,
    cancel: Option<Arc<AtomicBool>>,
    phase: Phase,
    prefill: Prefill,
    round: Round<'a>,
    /// The prefix cache's bookkeeping.
    reuse: Reuse,
    /// Whether the prefix cache is still to be looked up (when the request
    /// joins a step, [`RequestState::look_up`]).
    lookup: bool,
    sink: Sink<'a>,
    /// The prompt's own log-probabilities, when asked for.
    prompt_scores: Option<PromptScores>,
    pub(crate) stats: SpecStats,
    window: Option<Window>,
    /// The caches' offset before this step: a failed step rolls back here.
    step_start: usize,
    pub(crate) finish: Option<Finish>,
    error: Option<ServeError>,
    /// Why the planned window's masks could not be computed.
    mask_error: Option<ServeError>,
}

/// Rolls every cache back to `offset`, the start of a step that failed (a
/// forward may have appended to some caches and not others; a failed trim
/// may have trimmed some), as far as each cache can; whether every cache is
/// back there.
pub(crate) fn roll_back(caches: &mut CacheSet, offset: usize) -> bool {
    let mut back = true;
    for i in 0..caches.len() {
        if let Some(cache) = caches.get_mut(i) {
            let extra = cache.offset().saturating_sub(offset);
            if extra > 0 {
                if let Err(e) = cache.trim(extra) {
                    tracing::warn!(cache = i, error = %e, "a failed step's cache could not be rolled back");
                    back = false;
                }
            }
        }
    }
    back
}

/// Speculation needs every cache to drop a rejected draft: a target whose
/// fresh caches cannot append two tokens and drop one (a recurrent layer's)
/// is refused before any source opens, for every provider alike.
fn refuse_without_rollback(target: &dyn Target, provider: &str) -> Result<(), ServeError> {
    let caches = target.make_caches();
    let stuck = (0..caches.len()).find(|&i| caches.get(i).is_some_and(|c| !c.can_trim_after(2, 1)));
    match stuck {
        Some(cache) => Err(ServeError::NoRollback {
            provider: provider.to_string(),
            model_type: target.info().model_type.clone(),
            cache,
        }),
        None => Ok(()),
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

/// Log-probabilities of `logits` (`[1, V]`) after the processors and the
/// constraint's `mask`: refused ids at -inf, on the host for float32 logits
/// (`mlx_ext::mask`), with an MLX select otherwise; the time that takes is
/// added to `stats.mask_apply_seconds`.
fn logprobs(
    logits: &Array,
    history: &[u32],
    processors: &mut [Box<dyn LogitsProcessor + Send>],
    mask: Option<&TokenMask>,
    stats: &mut SpecStats,
) -> Result<Array, ServeError> {
    let mut row = logits.clone();
    for p in processors.iter_mut() {
        row = p.process(history, &row)?;
    }
    if let Some(mask) = mask {
        // The row (logits and processors) is evaluated first, so the time
        // counted is the mask's alone.
        row.eval()?;
        let start = std::time::Instant::now();
        mask.check_nonempty()?;
        row = match mlx_ext::mask::refuse(&row, mask.words())? {
            Some(masked) => masked,
            None => mask.apply(&row)?,
        };
        stats.mask_apply_seconds += start.elapsed().as_secs_f64();
    }
    Ok(mlx_ext::softmax::log_softmax(&row)?)
}

/// The `n` most likely tokens of log-probabilities `lp` (`[1, V]`), most
/// likely first (the lower id first among equals); empty when `n` is 0.
fn top_logprobs(lp: &Array, n: usize) -> Result<Vec<(u32, f32)>, ServeError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let host = lp.as_dtype(Dtype::Float32)?;
    host.eval()?;
    Ok(top_of(host.as_slice::<f32>(), n))
}

/// The `n` largest of `values` with their ids, largest first (the lower id
/// first among equals).
fn top_of(values: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut ids: Vec<u32> = (0..values.len() as u32).collect();
    let n = n.min(ids.len());
    let order = |a: &u32, b: &u32| {
        values[*b as usize]
            .total_cmp(&values[*a as usize])
            .then(a.cmp(b))
    };
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, order);
        ids.truncate(n);
    }
    ids.sort_by(order);
    ids.into_iter().map(|i| (i, values[i as usize])).collect()
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
    /// Opens the request's source (`provider`, the one its speculation
    /// names) and sets up its state. `prefix`: caches already holding a
    /// prefix of the prompt. `on_token` sees each emitted token after the
    /// request's own hook. `chunk` is the prefill chunk (a fixed grid from
    /// the prompt's start). With `reuse` (the prefix cache's settings), a
    /// request that brings no prefix of its own looks the cache up when it
    /// joins a step ([`RequestState::look_up`]), and keeps snapshots of its
    /// caches at its exact boundaries for [`RequestState::take_entries`].
    pub(crate) fn new(
        target: &'a dyn Target,
        request: Request,
        provider: Option<&dyn DraftProvider>,
        prefix: Option<CacheSet>,
        on_token: TokenHook<'a>,
        chunk: usize,
        reuse: Option<PrefixCacheConfig>,
    ) -> Result<Self, ServeError> {
        let Request {
            prompt,
            max_tokens,
            eos,
            sampler,
            processors,
            speculation,
            tenant,
            cache_salt,
            cancel,
            on_token: own_hook,
            constraint,
            forced_drafts,
            top_logprobs,
            prompt_logprobs,
            prediction,
        } = request;
        let sampler = sampler.build(target.info().vocab_size)?;
        let speculation = match (speculation, provider) {
            (Some(choice), Some(provider)) => Some((provider, choice.config)),
            (Some(choice), None) => {
                return Err(ServeError::NoSuchProvider {
                    id: choice.id,
                    loaded: String::new(),
                })
            }
            (None, _) => None,
        };
        if prompt.is_empty() {
            return Err(ServeError::EmptyPrompt);
        }
        if chunk == 0 {
            return Err(ServeError::Config(
                "the prefill chunk must hold at least one token".into(),
            ));
        }
        let own_prefix = prefix.is_some();
        if own_prefix && prompt_logprobs.is_some() {
            return Err(ServeError::Config(
                "prompt log-probabilities need the whole prompt run: not with a cached prefix of the request's own".into(),
            ));
        }
        let partition = crate::prefix_cache::cache_partition(
            tenant.as_deref(),
            cache_salt.as_deref(),
            reuse.is_some_and(|c| c.share_tenants),
        );
        let (source, config, provider, state_key) = match speculation {
            Some((provider, config)) => {
                refuse_without_rollback(target, provider.id())?;
                let context = spec_core::OpenContext { tenant, prediction };
                let source = provider
                    .open_with(target, &context)
                    .map_err(|e| ServeError::source(provider.id(), e))?;
                (
                    Some(source),
                    config,
                    Some(provider.id().to_string()),
                    Some(crate::prefix_cache::state_key(provider)),
                )
            }
            None => (None, SpecConfig::default(), None, None),
        };

        let taps = source.as_ref().is_some_and(|s| !s.tap_layers().is_empty());
        let rule = Boundaries::of(target, chunk);
        let keep_snapshots = reuse.is_some() && !own_prefix;
        // Scoring the prompt runs all of it: no cached prefix is read (the
        // request's own prefixes still go to the cache).
        let lookup = keep_snapshots && prompt_logprobs.is_none();
        let caches = prefix.unwrap_or_else(|| target.make_caches());
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
        // The grid starts at 0: a prefix of the request's own keeps it.
        let grid_origin = 0;
        let mode = source
            .as_ref()
            .map_or(PrefillMode::TailSplit, |s| s.prefill_mode());
        let rejection = config.verify == VerifyMode::Rejection && !sampler.is_greedy();
        let pending = prompt[prompt.len() - 1];
        let grid = Grid {
            prompt_len: prompt.len(),
            chunk,
            start,
            origin: grid_origin,
        };
        Ok(Self {
            target,
            history: prompt.to_vec(),
            prompt,
            caches,
            sampler,
            processors,
            cancel,
            phase: Phase::Prefill { next: start },
            prefill: Prefill::new(mode, chunk, grid_origin, start),
            round: Round::new(
                source,
                provider,
                &config,
                rejection,
                pending,
                constraint.map(|c| Constrained::new(c, eos.clone(), forced_drafts)),
                top_logprobs,
            ),
            reuse: Reuse::new(rule, keep_snapshots, &grid, partition, state_key),
            lookup,
            sink: Sink::new(eos, own_hook, on_token, max_tokens),
            prompt_scores: prompt_logprobs.map(PromptScores::new),
            stats: SpecStats::default(),
            window: None,
            step_start: start,
            finish: None,
            error: None,
            mask_error: None,
        })
    }

    /// The prefix cache's partition this request reads and fills.
    pub(crate) fn partition(&self) -> &str {
        &self.reuse.partition
    }

    /// Starts from the longest usable prefix `cache` holds for this
    /// request (once, before its first step; nothing when it brought a
    /// prefix of its own, scores its prompt or the cache is off). A source
    /// that reads tapped layers takes only entries holding its own saved
    /// state, within what that covers.
    pub(crate) fn look_up(&mut self, cache: &mut PrefixCache) {
        if !std::mem::take(&mut self.lookup) {
            return;
        }
        let taps = !self.round.taps().is_empty();
        let key = self.reuse.state_key.clone();
        let state_of = key.as_deref().filter(|_| taps);
        let rule = self.reuse.rule;
        let Some(hit) = cache.lookup_in(&self.reuse.partition, &self.prompt, rule, state_of) else {
            return;
        };
        let start = hit.caches.offset();
        if start == 0 || start >= self.prompt.len() {
            return;
        }
        self.reuse.restore = key.as_deref().and_then(|key| {
            let (_, saved) = hit.drafts.iter().find(|(p, _)| p == key)?;
            Some((Rc::clone(saved), hit.tokens.min(saved.tokens())))
        });
        // On a split-invariant target the new tokens run on a grid from
        // the hit (as few chunks as they need); otherwise the grid stays.
        let origin = if rule == Boundaries::Any { start } else { 0 };
        let chunk = self.prefill.chunk();
        self.caches = hit.caches;
        self.step_start = start;
        self.phase = Phase::Prefill { next: start };
        self.prefill = Prefill::new(self.prefill.mode, chunk, origin, start);
        self.reuse.start_at(&Grid {
            prompt_len: self.prompt.len(),
            chunk,
            start,
            origin,
        });
    }

    /// Whether the source started from a prefix-cache entry's saved state.
    pub(crate) fn draft_restored(&self) -> bool {
        self.reuse.draft_restored
    }

    /// What the request leaves to the prefix cache ([`Reuse::take_entries`]).
    /// Takes the caches: call it only as the request ends. The entries
    /// belong to [`RequestState::partition`].
    pub(crate) fn take_entries(&mut self) -> (Vec<Entry>, Boundaries) {
        self.reuse.take_entries(
            self.error.is_some(),
            &mut self.caches,
            &self.prompt,
            &self.history,
        )
    }

    /// When the request first took part in a step.
    pub(crate) fn started_at(&self) -> Option<Instant> {
        self.sink.started
    }

    /// When the first token was emitted.
    pub(crate) fn first_token_at(&self) -> Option<Instant> {
        self.sink.first_token
    }

    /// Whether the request is plain (no source, no processors, no
    /// constraint, no top log-probabilities) and decoding.
    pub(crate) fn plain_decoding(&self) -> bool {
        self.phase == Phase::Decode
            && self.round.is_plain()
            && self.round.is_unconstrained()
            && self.processors.is_empty()
            && self.finish.is_none()
            && !self.sink.is_full()
    }

    /// The decoder layers this request's source taps (none when plain).
    pub(crate) fn taps(&self) -> &[usize] {
        self.round.taps()
    }

    fn body_end(&self) -> usize {
        self.prompt.len() - 1
    }

    /// What the next step must give this request.
    pub(crate) fn need(&self) -> Need {
        match self.phase {
            Phase::Done => Need::Done,
            Phase::Prefill { next } if next < self.body_end() => {
                Need::Prefill(self.prefill.chunk_end(next, self.body_end()) - next)
            }
            Phase::Prefill { .. } if self.prefill.mode == PrefillMode::Full => Need::Prefill(1),
            Phase::Last => Need::Prefill(1),
            Phase::Prefill { .. } | Phase::Decode => Need::Decode,
        }
    }

    /// This step's round as the goodput policy sees it, when the request
    /// decodes with a source whose length the policy may cut.
    pub(crate) fn draft_profile(&mut self) -> Option<crate::goodput::RowProfile> {
        // Only greedy requests: a sampled one's draws (its drafter's, its
        // acceptance's) follow its windows' shapes, so its lengths stay its
        // own controller's and its seeded output stays its own.
        if self.phase != Phase::Decode
            || self.sink.is_full()
            || self.is_cancelled()
            || !self.sampler.is_greedy()
        {
            return None;
        }
        self.round.profile(
            self.sink.remaining(),
            &self.history,
            &self.caches,
            self.sampler.as_mut(),
        )
    }

    /// What this request's rounds measured of its provider's acceptance.
    pub(crate) fn learned(&self) -> Option<(&str, crate::priors::Learned)> {
        self.round.learned()
    }

    /// Starts this request's acceptance estimates from its provider's
    /// finished requests.
    pub(crate) fn start_from(&mut self, priors: &crate::priors::ProviderPriors) {
        self.round.start_from(priors);
    }

    /// The goodput policy's length for this step's round (of `cap`).
    pub(crate) fn limit_draft(&mut self, len: usize, cap: usize) {
        self.round.limit_to(len, cap);
    }

    /// Ends the request (no row this step) when it was cancelled.
    pub(crate) fn poll_cancel(&mut self) {
        if self.phase != Phase::Done && self.is_cancelled() {
            self.end(Finish::Cancelled);
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn end(&mut self, finish: Finish) {
        self.finish = Some(finish);
        self.phase = Phase::Done;
        self.window = None;
        self.round.clear();
    }

    /// Fails the request: caches back at the step's start, the error kept
    /// for [`RequestState::close`].
    pub(crate) fn fail(&mut self, error: ServeError) {
        roll_back(&mut self.caches, self.step_start);
        self.error = Some(error);
        self.phase = Phase::Done;
        self.window = None;
        self.round.clear();
    }

    /// Caches back at the step's start (a shared forward failed; the row is
    /// retried alone).
    /// Whether every cache is back at the step's start (the row may then
    /// be retried).
    pub(crate) fn roll_back_step(&mut self) -> bool {
        roll_back(&mut self.caches, self.step_start)
    }

    pub(crate) fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Plans this step's row; `false` when the request ended (or failed)
    /// while planning and has no row.
    pub(crate) fn plan(&mut self) -> bool {
        self.sink.start();
        // Every earlier step is final: caches that keep states to roll
        // back to (a recurrent layer's) free them.
        self.caches.commit_to(self.caches.offset());
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
                let end = self.prefill.chunk_end(next, self.body_end());
                return Ok(Some(Window {
                    tokens: self.prompt[next..end].to_vec(),
                    form: RowForm::Prefill,
                    wanted: if self.prompt_scores.is_some() {
                        Wanted::All
                    } else {
                        Wanted::None
                    },
                }));
            }
            if self.prefill.mode == PrefillMode::Full {
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
        let ctx = self.prefill.take_taps()?;
        let start = self.prefill.cached_tokens;
        if let Some(src) = self.round.source.as_mut() {
            let taps = !src.tap_layers().is_empty();
            let named = |e| ServeError::source(self.round.provider.as_deref().unwrap_or("?"), e);
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
            if self.reuse.keeps() {
                self.reuse.set_saved_draft(src.save_prefill().map(Rc::from));
            }
        }
        self.phase = Phase::Decode;
        Ok(())
    }

    /// Drops the cached prefix and prefills from the prompt's start.
    fn restart_cold(&mut self) {
        tracing::debug!(
            provider = self.round.provider.as_deref(),
            cached = self.prefill.cached_tokens,
            "the source declined its saved state: prefilling cold"
        );
        self.caches = self.target.make_caches();
        self.step_start = 0;
        self.round.anchor = None;
        self.phase = Phase::Prefill { next: 0 };
        self.prefill.restart_cold();
        if let Some(scores) = self.prompt_scores.as_mut() {
            scores.clear();
        }
        self.reuse
            .restart_cold(self.prompt.len(), self.prefill.chunk());
    }

    fn plan_round(&mut self) -> Result<Option<Window>, ServeError> {
        self.sink.start_generation();
        if self.sink.is_full() {
            self.end(Finish::MaxTokens);
            return Ok(None);
        }
        if self.is_cancelled() {
            self.end(Finish::Cancelled);
            return Ok(None);
        }
        let tokens = self.round.draft(
            self.sink.remaining(),
            &self.history,
            &self.caches,
            self.sampler.as_mut(),
            &mut self.stats,
        )?;
        Ok(Some(Window {
            tokens,
            form: RowForm::Decode,
            wanted: Wanted::All,
        }))
    }

    /// Computes the planned window's constraint masks (called while the
    /// step's forward runs); a failure fails the request once the step is
    /// done (its caches then roll back with the rest of the step).
    pub(crate) fn prepare_masks(&mut self) {
        if self.window.is_none() {
            return;
        }
        if let Err(e) = self.round.prepare_masks(&mut self.stats) {
            self.mask_error = Some(e);
        }
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
        if let Some(e) = self.mask_error.take() {
            self.fail(e);
            return;
        }
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
                self.round.anchor = Some(hidden.index((.., -1.., ..)));
                self.prefill.push_taps(taps);
                if let Some(scores) = self.prompt_scores.as_mut() {
                    let after = &self.prompt[next + 1..next + 1 + window.tokens.len()];
                    scores.push_chunk(logits.ok_or_else(missing)?, after)?;
                }
                let next = next + window.tokens.len();
                self.phase = Phase::Prefill { next };
                self.reuse
                    .after_chunk(next, &self.caches, self.sink.max_tokens());
                Ok(())
            }
            Phase::Last => {
                self.round.anchor = Some(hidden.index((.., -1.., ..)));
                self.prefill.push_taps(taps);
                self.finish_prefill()?;
                if self.phase != Phase::Decode {
                    return Ok(());
                }
                self.sink.start_generation();
                if self.sink.is_full() {
                    // No token asked for (a prompt only scored).
                    self.end(Finish::MaxTokens);
                    return Ok(());
                }
                let logits = logits.ok_or_else(missing)?;
                let mask = match self.round.constraint.as_mut() {
                    Some(c) => {
                        c.prepare(&[], &mut self.stats)?;
                        let mask = c.mask(0).cloned();
                        c.clear();
                        mask
                    }
                    None => None,
                };
                if mask
                    .as_ref()
                    .is_some_and(|m| m.count() == 0 && m.end_allowed)
                {
                    self.end(Finish::Eos);
                    return Ok(());
                }
                let lp = logprobs(
                    &logits.index((.., -1, ..)),
                    &self.history,
                    &mut self.processors,
                    mask.as_ref(),
                    &mut self.stats,
                )?;
                let first = token_of(&self.sampler.sample(&lp)?)?;
                let logprob = chosen_logprob(&lp, first)?;
                let top = top_logprobs(&lp, self.round.top_logprobs())?;
                self.round.resume_from(first);
                if let Some(finish) = self.emit(first, logprob, top)? {
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

    /// Verification of a round's window: the round walks it, the caches
    /// drop the rejected drafts, the source hears the result, and the
    /// accepted drafts and the target's next token are emitted.
    fn verify(
        &mut self,
        hidden: &Array,
        taps: Option<&Array>,
        logits: &Array,
    ) -> Result<(), ServeError> {
        self.round.prepare_masks(&mut self.stats)?;
        let (drafted, walked) = self.round.walk(
            logits,
            &self.history,
            &mut self.processors,
            self.sampler.as_mut(),
            &mut self.stats,
        )?;
        let d = drafted.tokens().len();
        let accepted = walked.accepted;
        self.stats.record_round(d, accepted);
        self.stats.forced_accepted += accepted.saturating_sub(d - drafted.forced());
        if accepted < d {
            self.caches.trim(d - accepted)?;
        }
        self.round.commit(&drafted, &walked, hidden, taps)?;
        let Walked {
            next,
            logprobs,
            top,
            complete,
            ..
        } = walked;
        let emitted = drafted.tokens()[..accepted]
            .iter()
            .copied()
            .chain((!complete).then_some(next));
        for ((t, logprob), top) in emitted.zip(logprobs).zip(top) {
            if let Some(finish) = self.emit(t, logprob, top)? {
                self.end(finish);
                return Ok(());
            }
        }
        if complete {
            self.end(Finish::Eos);
        }
        Ok(())
    }

    /// Emits `token`; the constraint advances over it, and a constraint
    /// that is then complete ends the request as an EOS token would.
    fn emit(
        &mut self,
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    ) -> Result<Option<Finish>, ServeError> {
        if self.sink.is_eos(token) {
            return Ok(Some(Finish::Eos));
        }
        if let Some(c) = self.round.constraint.as_mut() {
            c.commit(token)?;
        }
        if let Some(finish) = self.sink.emit(&mut self.history, token, logprob, top) {
            return Ok(Some(finish));
        }
        let complete = self
            .round
            .constraint
            .as_ref()
            .is_some_and(|c| c.is_complete());
        Ok(complete.then_some(Finish::Eos))
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
        self.round.finish(outcome);
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.stats.emitted = self.sink.tokens.len();
        self.stats.paused = self.round.paused();
        let stats = self.stats.clone();
        tracing::info!(
            provider = self.round.provider.as_deref(),
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
            top_logprobs: std::mem::take(&mut self.sink.top_logprobs),
            prompt_logprobs: self
                .prompt_scores
                .as_mut()
                .map(|s| std::mem::take(&mut s.scores))
                .unwrap_or_default(),
            finish: self.finish.unwrap_or(Finish::MaxTokens),
            stats,
            prompt_seconds: self.sink.prompt_seconds,
            cached_tokens: self.prefill.cached_tokens,
            generation_seconds: self.sink.generation_seconds(),
        })
    }
}
