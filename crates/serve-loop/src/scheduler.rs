//! The scheduler: many requests, one target forward per step. Each step
//! collects the active requests' rows (verify windows, prompt chunks within
//! a token budget), runs ONE [`Target::forward_batch`] over them and ONE
//! [`Target::logits`] over the positions that need logits, then lets each
//! request absorb its rows. Requests join from a queue (up to `max_batch`
//! active) and leave at any step.

use std::collections::VecDeque;
use std::ops::ControlFlow;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::{BatchOutput, DraftProvider, SpecError, Target};

use crate::goodput::allocate;
use crate::prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheStats};
use crate::priors::ProviderPriors;
use crate::request::{chosen, Need, RequestState, Wanted};
use crate::shared_prefill;
use crate::step_cost::{StepCost, StepCostStats};
use crate::{Output, Request, ServeError};

/// Prompt tokens per prefill chunk by default: a long prompt advances by
/// this much per step, so it never stalls the decoding rows for long.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// How steps are formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Most requests active at once (the rest wait in the queue); at least 1.
    pub max_batch: usize,
    /// Prompt tokens per prefill chunk, on a fixed grid from the prompt's
    /// start (`prompt[..len-1]`; a full prefill then runs the last token
    /// alone), so a prompt row's bits do not depend on what else runs in
    /// its step; at least 1. mlx-lm chunks at 2048 (its
    /// `prefill_step_size`): prompts longer than the chunk are cut
    /// elsewhere than mlx-lm cuts them.
    pub prefill_chunk: usize,
    /// Prompt tokens a step may take over all prefilling requests; the
    /// oldest prefilling request gets its chunk even past it. Decoding rows
    /// never count against it.
    pub prefill_budget: usize,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            max_batch: 8,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            prefill_budget: DEFAULT_PREFILL_CHUNK,
        }
    }
}

impl ScheduleConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ServeError> {
        if self.max_batch == 0 {
            return Err(ServeError::Config("max_batch must be at least 1".into()));
        }
        if self.prefill_chunk == 0 {
            return Err(ServeError::Config(
                "the prefill chunk must hold at least one token".into(),
            ));
        }
        Ok(())
    }
}

/// The request a step's results belong to, as [`Scheduler::submit`] named it.
pub type JobId = u64;

/// A request that left the scheduler.
#[derive(Debug)]
pub struct Finished {
    /// Its id.
    pub id: JobId,
    /// Its output, or why it failed.
    pub result: Result<Output, ServeError>,
    /// When it first took part in a step.
    pub joined: Option<std::time::Instant>,
    /// When it emitted its first token.
    pub first_token: Option<std::time::Instant>,
}

impl Finished {
    fn of(id: JobId, state: RequestState<'_>) -> Self {
        let joined = state.started_at();
        let first_token = state.first_token_at();
        Finished {
            id,
            result: state.close(),
            joined,
            first_token,
        }
    }
}

/// What one [`Scheduler::step`] did.
#[derive(Debug, Default)]
pub struct StepReport {
    /// Requests that had a row in the step's forward.
    pub rows: usize,
    /// Requests that ended in the step.
    pub finished: Vec<Finished>,
}

/// What one [`Scheduler::decode_pipelined`] did.
#[derive(Debug, Default)]
pub struct PipelinedReport {
    /// Target forwards it ran (`rows` rows each).
    pub forwards: usize,
    /// The requests that decoded together.
    pub rows: usize,
    /// The requests that ended.
    pub finished: Vec<Finished>,
}

/// Holds the active and queued requests of one target and advances them
/// together. Every request's tokens equal its tokens alone (through
/// [`crate::generate`] with the same [`ScheduleConfig::prefill_chunk`]).
pub struct Scheduler<'a> {
    target: &'a dyn Target,
    config: ScheduleConfig,
    /// The providers requests may name.
    providers: Vec<&'a dyn DraftProvider>,
    queued: VecDeque<(JobId, RequestState<'a>)>,
    active: Vec<(JobId, RequestState<'a>)>,
    next_id: JobId,
    prefix_cache: PrefixCache,
    /// What a step costs here, learned from the steps run.
    cost: StepCost,
    /// What finished requests measured of each provider's acceptance.
    priors: ProviderPriors,
    /// Whether queued requests wait for a prefix an active one shares
    /// ([`crate::shared_prefill`]).
    shared_prefill: bool,
}

impl std::fmt::Debug for Scheduler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("queued", &self.queued.len())
            .field("active", &self.active.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Scheduler<'a> {
    /// A scheduler over `target`.
    pub fn new(target: &'a dyn Target, config: ScheduleConfig) -> Result<Self, ServeError> {
        config.validate()?;
        Ok(Self {
            target,
            config,
            providers: Vec::new(),
            queued: VecDeque::new(),
            active: Vec::new(),
            next_id: 0,
            prefix_cache: PrefixCache::new(PrefixCacheConfig::off()),
            cost: StepCost::new(),
            priors: ProviderPriors::default(),
            shared_prefill: true,
        })
    }

    /// The providers a request's [`Request::speculation`] may name, by id
    /// (none by default: every request decodes plainly).
    pub fn with_providers(mut self, providers: &[&'a dyn DraftProvider]) -> Self {
        self.providers = providers.to_vec();
        self
    }

    /// Turns the prefix cache on with these bounds (it is off by default):
    /// requests submitted without a prefix of their own start from the
    /// longest usable cached prefix, and what every request leaves (its
    /// prefill snapshots; on a split-invariant target its prompt and
    /// generated tokens) is kept when it ends (see [`crate::prefix_cache`]).
    pub fn with_prefix_cache(mut self, config: PrefixCacheConfig) -> Self {
        self.prefix_cache = PrefixCache::new(config);
        self
    }

    /// Whether a queued request may wait for (and start from) a prefix an
    /// active request of its partition holds or is prefilling, instead of
    /// prefilling it beside it (on by default; it needs the prefix cache;
    /// see [`crate::shared_prefill`]). Only speed changes.
    pub fn with_shared_prefill(mut self, on: bool) -> Self {
        self.shared_prefill = on;
        self
    }

    /// Uses `cache` (with what it holds) as the prefix cache.
    pub fn with_prefix_cache_from(mut self, cache: PrefixCache) -> Self {
        self.prefix_cache = cache;
        self
    }

    /// Takes the prefix cache out (for a scheduler that follows this one),
    /// leaving an off one.
    pub fn take_prefix_cache(&mut self) -> PrefixCache {
        std::mem::take(&mut self.prefix_cache)
    }

    /// The prefix cache's counters.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefix_cache.stats()
    }

    /// Starts from `cost` as the step cost model (it goes on learning from
    /// the steps run); a new scheduler starts from an empty one.
    pub fn with_step_cost(mut self, cost: StepCost) -> Self {
        self.cost = cost;
        self
    }

    /// The step cost model's fit and counters.
    pub fn step_cost_stats(&self) -> StepCostStats {
        self.cost.stats()
    }

    /// Drops the prefix cache's draft states saved under `key` (a provider
    /// that is going away).
    pub(crate) fn forget_drafts_of(&mut self, key: &str) {
        self.prefix_cache.forget_drafts_of(key);
    }

    /// The prefix cache's settings, when it is on (a new request then
    /// looks it up when it joins a step, and fills it).
    pub(crate) fn reuse(&self) -> Option<PrefixCacheConfig> {
        Some(self.prefix_cache.config()).filter(PrefixCacheConfig::is_on)
    }

    /// Ends `state`: what it leaves goes to the prefix cache, then it
    /// closes.
    fn retire(&mut self, id: JobId, mut state: RequestState<'a>) -> Finished {
        if state.draft_restored() {
            self.prefix_cache.note_draft_restored();
        }
        if let Some((provider, learned)) = state.learned() {
            self.priors.absorb(provider, &learned);
        }
        let (entries, rule) = state.take_entries();
        for (tokens, caches, drafts) in entries {
            self.prefix_cache
                .insert_in(state.partition().to_owned(), tokens, caches, drafts, rule);
        }
        Finished::of(id, state)
    }

    /// Queues a request; it joins at the next step with a free place.
    /// `on_token` sees each emitted token and its log-probability (on this
    /// thread, inside [`Scheduler::step`]); `Break` stops the request. The
    /// request's source is opened here: a provider that cannot open fails
    /// the submission, and so does a provider the scheduler does not hold
    /// ([`Scheduler::with_providers`]).
    pub fn submit(
        &mut self,
        request: Request,
        on_token: impl FnMut(&crate::Emitted<'_>) -> ControlFlow<()> + 'a,
    ) -> Result<JobId, ServeError> {
        let provider = chosen(&request, &self.providers)?;
        let chunk = self.config.prefill_chunk;
        let state = RequestState::new(
            self.target,
            request,
            provider,
            None,
            Box::new(on_token),
            chunk,
            self.reuse(),
        )?;
        Ok(self.enqueue(state))
    }

    pub(crate) fn enqueue(&mut self, mut state: RequestState<'a>) -> JobId {
        state.start_from(&self.priors);
        let id = self.next_id;
        self.next_id += 1;
        self.queued.push_back((id, state));
        id
    }

    /// The settings.
    pub fn config(&self) -> &ScheduleConfig {
        &self.config
    }

    /// The target.
    pub fn target(&self) -> &'a dyn Target {
        self.target
    }

    /// Requests taking part in steps.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting for a place.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Whether no request is active or queued.
    pub fn is_idle(&self) -> bool {
        self.active.is_empty() && self.queued.is_empty()
    }

    /// Admits queued requests, runs one step, and returns the requests that
    /// ended in it.
    pub fn step(&mut self) -> StepReport {
        let mut finished = Vec::new();
        // A cancelled request leaves the queue at once, without a row.
        let mut i = 0;
        while i < self.queued.len() {
            if self.queued[i].1.is_cancelled() {
                if let Some((id, mut state)) = self.queued.remove(i) {
                    state.poll_cancel();
                    finished.push(self.retire(id, state));
                }
            } else {
                i += 1;
            }
        }
        self.admit();
        let mut states: Vec<&mut RequestState<'a>> =
            self.active.iter_mut().map(|(_, s)| s).collect();
        let rows = run_step(self.target, &self.config, &mut states, &mut self.cost);
        if self.prefix_cache.config().is_on() {
            for (_, state) in self.active.iter_mut() {
                shared_prefill::publish(state, &mut self.prefix_cache);
            }
        }
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].1.is_done() {
                let (id, state) = self.active.remove(i);
                finished.push(self.retire(id, state));
            } else {
                i += 1;
            }
        }
        StepReport { rows, finished }
    }

    /// Moves queued requests into free places, in order, each starting from
    /// the longest prefix the prefix cache holds for it; one waiting for a
    /// prefix an active request is about to publish keeps its place in
    /// the queue and a place in the batch ([`crate::shared_prefill`]).
    fn admit(&mut self) {
        let sharing = self.shared_prefill && self.prefix_cache.config().is_on();
        let mut i = 0;
        // A request waiting for a shared prefix keeps a place in the batch:
        // the ones behind it take only the others.
        let mut reserved = 0;
        while self.active.len() + reserved < self.config.max_batch && i < self.queued.len() {
            let (_, state) = &self.queued[i];
            if sharing && !shared_prefill::may_join(state, &mut self.active, &mut self.prefix_cache)
            {
                reserved += 1;
                i += 1;
                continue;
            }
            if let Some((id, mut state)) = self.queued.remove(i) {
                state.look_up(&mut self.prefix_cache);
                self.active.push((id, state));
            }
        }
    }

    /// When every active request (none queued) is plain (no source, no
    /// logits processors) and decoding: decodes them pipelined until one
    /// ends or `interrupt` answers `true`, asked before each forward is
    /// queued (a request arrived, something else needs a step). One request
    /// decodes as [`crate::generate`] does; several share each forward
    /// (`Target::decode_rows` on the lazily sampled tokens). The requests
    /// are then left as a step leaves them, with the same tokens. `None`
    /// when the scheduler holds anything else: run [`Scheduler::step`].
    pub fn decode_pipelined(
        &mut self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Option<PipelinedReport> {
        if !self.queued.is_empty()
            || self.active.is_empty()
            || !self.active.iter().all(|(_, s)| s.plain_decoding())
        {
            return None;
        }
        let rows = self.active.len();
        let forwards = if let [(_, state)] = self.active.as_mut_slice() {
            state.decode_pipelined(interrupt)
        } else {
            let mut states: Vec<&mut RequestState<'_>> =
                self.active.iter_mut().map(|(_, s)| s).collect();
            crate::request::decode_rows_pipelined(self.target, &mut states, interrupt)
        };
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].1.is_done() {
                let (id, state) = self.active.remove(i);
                finished.push(self.retire(id, state));
            } else {
                i += 1;
            }
        }
        Some(PipelinedReport {
            forwards,
            rows,
            finished,
        })
    }

    /// Ends every request now (as cancelled), active and queued alike.
    pub fn close_all(&mut self) -> Vec<Finished> {
        let held: Vec<_> = self.active.drain(..).chain(self.queued.drain(..)).collect();
        held.into_iter()
            .map(|(id, state)| self.retire(id, state))
            .collect()
    }
}

/// One step over `states`: chooses the draft lengths (the goodput policy,
/// with `cost`), plans, one shared forward, absorbs; a step of decoding rows
/// only teaches `cost` its time. Returns how many rows the forward held.
pub(crate) fn run_step(
    target: &dyn Target,
    config: &ScheduleConfig,
    states: &mut [&mut RequestState<'_>],
    cost: &mut StepCost,
) -> usize {
    let started = std::time::Instant::now();
    // Which requests get a row: every decoding one; prefilling ones in
    // order while the budget lasts, the first of them always.
    let mut budget = config.prefill_budget;
    let mut prefilling = false;
    let mut chosen = Vec::with_capacity(states.len());
    for (i, state) in states.iter_mut().enumerate() {
        state.poll_cancel();
        match state.need() {
            Need::Done => {}
            Need::Decode => chosen.push(i),
            Need::Prefill(len) => {
                if !prefilling || len <= budget {
                    prefilling = true;
                    budget = budget.saturating_sub(len);
                    chosen.push(i);
                }
            }
        }
    }
    let prefill_tokens = draft_lengths(states, &chosen, cost);
    let mut planned: Vec<&mut RequestState<'_>> = Vec::with_capacity(chosen.len());
    for (i, state) in states.iter_mut().enumerate() {
        if chosen.contains(&i) && state.plan() {
            planned.push(&mut **state);
        }
    }
    if planned.is_empty() {
        return 0;
    }
    let rows = planned.len();
    let tokens: usize = planned
        .iter()
        .map(|s| s.window().map_or(0, |w| w.tokens.len()))
        .sum();
    match shared_forward(target, &mut planned) {
        Ok(step) => {
            step.hand_out(&mut planned);
            if prefill_tokens == 0 {
                cost.observe(rows, tokens, started.elapsed().as_secs_f64());
            }
        }
        Err(e) if planned.len() == 1 => planned[0].fail(e),
        Err(e) => {
            // Retry the rows one at a time: only a row that fails alone fails.
            tracing::warn!(error = %e, rows, "a batched step failed; retrying its rows one by one");
            // A row whose caches cannot return to the step's start (a
            // cache with no way back that far) fails instead: a retry
            // would run its tokens twice.
            for state in planned.iter_mut() {
                if !state.roll_back_step() {
                    state.fail(ServeError::Spec(SpecError::Internal(
                        "a shared step failed and this request's caches could not roll back to its start",
                    )));
                }
            }
            for state in planned.iter_mut().filter(|s| !s.is_done()) {
                let mut one = [&mut **state];
                match shared_forward(target, &mut one) {
                    Ok(step) => step.hand_out(&mut one),
                    Err(e) => one[0].fail(e),
                }
            }
        }
    }
    rows
}

/// Gives each chosen decoding row whose length the goodput policy may cut
/// its length for this step, once `cost` has a model (until then each
/// keeps its controller's). Returns the prompt tokens the step will run.
fn draft_lengths(states: &mut [&mut RequestState<'_>], chosen: &[usize], cost: &StepCost) -> usize {
    let mut prefill = 0;
    let mut plain = 0;
    let mut rows = Vec::new();
    let mut profiles = Vec::new();
    for &i in chosen {
        match states[i].need() {
            Need::Prefill(len) => prefill += len,
            Need::Done => {}
            Need::Decode => match states[i].draft_profile() {
                Some(p) => {
                    rows.push(i);
                    profiles.push(p);
                }
                None => plain += 1,
            },
        }
    }
    let Some(fit) = cost.fit() else {
        return prefill;
    };
    // A lone row keeps its controller's length: the step is its own, and
    // the fitted per-token cost (learned mostly where rows share steps)
    // overstates what one row's extra verify tokens cost, so cutting there
    // lost speed in `bench serve`'s 1-client cells.
    if profiles.is_empty() || (profiles.len() == 1 && plain == 0 && prefill == 0) {
        return prefill;
    }
    // What the step costs whatever the drafts: its rows (the prompt rows
    // too: at most one per chosen request).
    let base = fit.base + fit.per_row * chosen.len() as f64;
    let per_token = fit.per_token;
    let lengths = allocate(&profiles, plain, prefill, base, per_token);
    for ((&i, len), profile) in rows.iter().zip(lengths).zip(&profiles) {
        states[i].limit_draft(len, profile.cap);
    }
    tracing::trace!(
        rows = rows.len(),
        plain,
        prefill,
        base,
        per_token,
        "goodput draft lengths"
    );
    prefill
}

/// A step's forward results, packed.
struct Step {
    out: BatchOutput,
    /// The union of the rows' taps, in the order the forward was asked.
    taps: Vec<usize>,
    hidden_size: usize,
    /// Logits of the wanted positions `[1, P, V]`, and where each row's lie.
    logits: Option<Array>,
    logit_rows: Vec<Option<std::ops::Range<i32>>>,
}

/// One forward over the planned rows and one head over the positions that
/// need logits, evaluated (so a failure shows here, not in a request's
/// verification); on failure every row may have advanced: the caller rolls
/// back.
fn shared_forward(
    target: &dyn Target,
    planned: &mut [&mut RequestState<'_>],
) -> Result<Step, ServeError> {
    let mut taps: Vec<usize> = planned.iter().flat_map(|s| s.taps().to_vec()).collect();
    taps.sort_unstable();
    taps.dedup();
    let wanted: Vec<Wanted> = planned
        .iter()
        .map(|s| s.window().map_or(Wanted::None, |w| w.wanted))
        .collect();
    let out = {
        let mut rows: Vec<_> = planned.iter_mut().filter_map(|s| s.batch_row()).collect();
        target.forward_batch(&mut rows, &taps)?
    };
    // The positions that need logits, in row order.
    let mut positions: Vec<i32> = Vec::new();
    let mut logit_rows = Vec::with_capacity(planned.len());
    for (span, wanted) in out.spans.iter().zip(&wanted) {
        let from = positions.len() as i32;
        match wanted {
            Wanted::None => {}
            Wanted::Last => positions.push(span.end as i32 - 1),
            Wanted::All => positions.extend(span.start as i32..span.end as i32),
        }
        let to = positions.len() as i32;
        logit_rows.push((to > from).then_some(from..to));
    }
    let total = out.spans.last().map_or(0, |s| s.end);
    let logits = if positions.is_empty() {
        None
    } else if positions.len() == total {
        Some(target.logits(&out.hidden)?)
    } else {
        let picked = out
            .hidden
            .take_axis(Array::from_slice(&positions, &[positions.len() as i32]), 1)?;
        Some(target.logits(&picked)?)
    };
    let mut outputs = vec![&out.hidden];
    outputs.extend(out.taps.as_ref());
    outputs.extend(logits.as_ref());
    // Constraint masks are computed here while the forward runs.
    mlx_rs::transforms::async_eval(outputs.iter().copied())?;
    for state in planned.iter_mut() {
        state.prepare_masks();
    }
    mlx_rs::transforms::eval(outputs)?;
    Ok(Step {
        out,
        taps,
        hidden_size: target.info().hidden_size,
        logits,
        logit_rows,
    })
}

impl Step {
    /// Gives each row its hidden states, its source's tap columns and its
    /// logits, and lets it absorb them.
    fn hand_out(self, planned: &mut [&mut RequestState<'_>]) {
        for (i, state) in planned.iter_mut().enumerate() {
            let Some(hidden) = self.out.row_hidden(i) else {
                state.fail(ServeError::Spec(spec_core::SpecError::Protocol(format!(
                    "the batched forward returned no row {i}"
                ))));
                continue;
            };
            let taps = match self.row_taps(i, state.taps()) {
                Ok(t) => t,
                Err(e) => {
                    state.fail(e);
                    continue;
                }
            };
            let logits = match (&self.logits, self.logit_rows.get(i).cloned().flatten()) {
                (Some(l), Some(r)) => Some(l.index((.., r, ..))),
                _ => None,
            };
            state.absorb(&hidden, taps, logits.as_ref());
        }
    }

    /// Row `i`'s taps with the columns of `want` (its source's layers, in
    /// its order) out of the step's union.
    fn row_taps(&self, i: usize, want: &[usize]) -> Result<Option<Array>, ServeError> {
        if want.is_empty() {
            return Ok(None);
        }
        let Some(all) = self.out.row_taps(i) else {
            return Err(ServeError::Spec(spec_core::SpecError::Protocol(
                "the batched forward returned no taps".into(),
            )));
        };
        if want == self.taps.as_slice() {
            return Ok(Some(all));
        }
        let h = self.hidden_size as i32;
        let mut blocks = Vec::with_capacity(want.len());
        for layer in want {
            let k = self.taps.iter().position(|t| t == layer).ok_or_else(|| {
                ServeError::Spec(spec_core::SpecError::Protocol(format!(
                    "tapped layer {layer} missing from the step's taps"
                )))
            })? as i32;
            blocks.push(all.index((.., .., k * h..(k + 1) * h)));
        }
        Ok(Some(mlx_rs::ops::concatenate(&blocks, -1)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_range_are_refused() {
        let check = |config: ScheduleConfig, ok: bool| {
            assert_eq!(config.validate().is_ok(), ok, "{config:?}");
        };
        check(ScheduleConfig::default(), true);
        check(
            ScheduleConfig {
                max_batch: 0,
                ..ScheduleConfig::default()
            },
            false,
        );
        check(
            ScheduleConfig {
                prefill_chunk: 0,
                ..ScheduleConfig::default()
            },
            false,
        );
        check(
            ScheduleConfig {
                prefill_budget: 0,
                ..ScheduleConfig::default()
            },
            true,
        );
    }
}
