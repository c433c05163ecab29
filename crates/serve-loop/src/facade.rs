//! The engine a host embeds: one thread owns the model and its providers
//! (MLX state stays on one thread) and runs the [`Scheduler`]; any thread
//! submits owned requests and reads their tokens as a stream.

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use spec_core::{BoxError, DraftProvider, ProviderOptions, Target};

use crate::prefix_cache::{
    Boundaries, PrefixCache, PrefixCacheConfig, PrefixCacheStats, PrefixStore,
};
use crate::provider_slots::ProviderSlots;
use crate::request::RequestState;
use crate::{
    Finished, JobId, Output, ProviderChoice, Request, ScheduleConfig, Scheduler, ServeError,
};

/// Builds a provider for a request's own options, on the engine thread:
/// `(id, target, options)`. The engine keeps what it builds for later
/// requests with the same id and options (a bounded set, see
/// [`EngineConfig::built_providers`]).
pub type ProviderFactory =
    Box<dyn Fn(&str, &dyn Target, &ProviderOptions) -> Result<Box<dyn DraftProvider>, BoxError>>;

/// What the engine's loader hands over, on the engine thread.
pub struct Loaded {
    /// The target model.
    pub target: Box<dyn Target>,
    /// The providers requests may name, by their ids.
    pub providers: Vec<Box<dyn DraftProvider>>,
    /// Builds providers for requests with their own options; `None`
    /// refuses such requests.
    pub factory: Option<ProviderFactory>,
    /// Where the prefix cache's entries persist (loaded before the engine
    /// reports ready); `None` keeps them in memory only.
    pub prefix_store: Option<Box<dyn PrefixStore>>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.providers.iter().map(|p| p.id()).collect();
        f.debug_struct("Loaded")
            .field("target", &self.target.info().model_type)
            .field("providers", &ids)
            .finish()
    }
}

/// The engine's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// How steps are formed (`max_batch` requests active at once).
    pub schedule: ScheduleConfig,
    /// Requests that may wait beyond the active ones; a submission past
    /// `max_batch + max_queue` is refused with [`ServeError::Busy`].
    pub max_queue: usize,
    /// Bounds of the in-memory prefix cache (on by default:
    /// [`crate::DEFAULT_PREFIX_CACHE_BYTES`], [`crate::DEFAULT_PREFIX_CACHE_ENTRIES`];
    /// [`PrefixCacheConfig::off`] turns it off). A server's
    /// `--prompt-cache-bytes` sets `max_bytes`.
    pub prefix_cache: PrefixCacheConfig,
    /// Distinct (provider, options) pairs built by the
    /// [`Loaded::factory`] and kept at once (each may hold a drafter model
    /// or a global tree). When a request needs one more, the least
    /// recently used is dropped from the set; requests running on it go on
    /// (it is freed when the last of them ends), and nothing waits for
    /// them.
    pub built_providers: usize,
    /// Whether requests sharing a prompt prefix with one in flight wait
    /// for its prefill instead of running the same tokens beside it
    /// ([`Scheduler::with_shared_prefill`]; on by default).
    pub shared_prefill: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            schedule: ScheduleConfig::default(),
            max_queue: 64,
            prefix_cache: PrefixCacheConfig::default(),
            built_providers: 4,
            shared_prefill: true,
        }
    }
}

/// A finished request, with its times in the engine.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The output (as [`crate::generate`] returns it).
    pub output: Output,
    /// Seconds from submission to its first step.
    pub queue_seconds: f64,
    /// Seconds from submission to its first token, when it emitted one.
    pub first_token_seconds: Option<f64>,
}

/// What a request's stream carries: tokens, then exactly one of `Done` or
/// `Failed`.
#[derive(Debug)]
pub enum Event {
    /// An emitted token and its log-probability.
    Token {
        /// The token id.
        token: u32,
        /// Its log-probability under the target's processed distribution.
        logprob: f32,
        /// The most likely tokens at its position
        /// ([`crate::Request::top_logprobs`] of them).
        top_logprobs: Vec<(u32, f32)>,
    },
    /// The request ended (EOS, max tokens, a stop, a cancellation).
    Done(Box<Completion>),
    /// The request failed; the others go on.
    Failed(ServeError),
}

/// Counters of the engine since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Steps that ran a forward.
    pub steps: u64,
    /// Of those, steps of a lone plain request decoded pipelined (the
    /// forward of step `k + 1` queued before token `k` is read back), as
    /// [`crate::generate`] decodes it; they count in `rows_per_step[1]` too.
    pub lone_steps: u64,
    /// Of those, steps of several plain requests decoded pipelined together
    /// (`Target::decode_rows` queued on the previous step's lazy tokens);
    /// they count in `rows_per_step` too.
    pub pipelined_steps: u64,
    /// `rows_per_step[k]`: steps whose forward held `k` requests' rows.
    pub rows_per_step: Vec<u64>,
    /// Requests that ended with an output (cancelled ones included).
    pub completed: u64,
    /// Requests that ended cancelled.
    pub cancelled: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Sum over requests of seconds from submission to their first step.
    pub queue_seconds: f64,
    /// Sum over requests with a token of seconds to their first token.
    pub first_token_seconds: f64,
    /// Requests that emitted a token.
    pub first_tokens: u64,
    /// The prefix cache: hits, misses, prompt tokens served from it, bytes
    /// and entries held, evictions.
    pub prefix_cache: PrefixCacheStats,
    /// The step cost model the goodput policy uses: its fitted base and
    /// per-token seconds, the steps it learned from and rejected.
    pub step_cost: crate::StepCostStats,
}

/// A request's stream of [`Event`]s (an iterator that ends after `Done`
/// or `Failed`), and its cancellation.
#[derive(Debug)]
pub struct RequestHandle {
    cancel: Arc<AtomicBool>,
    events: Receiver<Event>,
    ended: bool,
}

impl RequestHandle {
    /// Asks the request to stop; it ends within one step with
    /// [`crate::Finish::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// A flag that cancels the request when set, for another thread.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.cancel)
    }

    /// Waits for the end, dropping the tokens (they are in the output).
    pub fn wait(self) -> Result<Completion, ServeError> {
        for event in self {
            match event {
                Event::Token { .. } => {}
                Event::Done(done) => return Ok(*done),
                Event::Failed(e) => return Err(e),
            }
        }
        Err(ServeError::Stopped)
    }
}

impl Iterator for RequestHandle {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        let event = self
            .events
            .recv()
            .unwrap_or(Event::Failed(ServeError::Stopped));
        self.ended = !matches!(event, Event::Token { .. });
        Some(event)
    }
}

/// The engine: a thread that owns the model and runs the scheduler.
///
/// ```
/// use serve_loop::{Engine, EngineConfig, Event, Finish, Loaded, Request};
///
/// # let dir = tempfile::tempdir().map_err(|e| serve_loop::ServeError::Load(e.into()))?;
/// # spec_fixtures::llama::Llama::tiny(3).write(dir.path()).map_err(|e| serve_loop::ServeError::Load(e.into()))?;
/// let path = dir.path().to_path_buf();
/// // The loader runs on the engine thread: the model never leaves it.
/// let engine = Engine::start(EngineConfig::default(), move || {
///     let target = spec_models::load_model(&path, &Default::default())?;
///     Ok(Loaded { target: Box::new(target), providers: Vec::new(), factory: None, prefix_store: None })
/// })?;
/// let handle = engine.submit(Request::new(vec![1, 2, 3], 8))?;
/// let mut tokens = Vec::new();
/// for event in handle {
///     match event {
///         Event::Token { token, .. } => tokens.push(token),
///         Event::Done(done) => assert_eq!(done.output.finish, Finish::MaxTokens),
///         Event::Failed(e) => return Err(e),
///     }
/// }
/// assert_eq!(tokens.len(), 8);
/// engine.shutdown()?;
/// # Ok::<(), serve_loop::ServeError>(())
/// ```
pub struct Engine {
    commands: Sender<Command>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    limit: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("limit", &self.limit)
            .field("held", &self.shared.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

struct Shared {
    stats: Mutex<EngineStats>,
    /// Requests submitted and not yet ended.
    held: AtomicUsize,
    /// The panic that stopped the engine thread, once one has.
    failure: Mutex<Option<String>>,
}

enum Command {
    Submit(Box<Job>),
    Shutdown,
}

struct Job {
    request: Request,
    events: Sender<Event>,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
}

impl Engine {
    /// Starts the engine thread, which runs `load` (the model and the
    /// providers are made on the thread that uses them) and then serves.
    /// Returns once loading is done; a loader error comes back here.
    pub fn start<F>(config: EngineConfig, load: F) -> Result<Engine, ServeError>
    where
        F: FnOnce() -> Result<Loaded, BoxError> + Send + 'static,
    {
        config.schedule.validate()?;
        if config.built_providers == 0 {
            return Err(ServeError::Config(
                "built_providers must be at least 1".into(),
            ));
        }
        let (commands, inbox) = channel();
        let (ready_tx, ready) = sync_channel::<Result<(), BoxError>>(1);
        let shared = Arc::new(Shared {
            stats: Mutex::new(EngineStats::default()),
            held: AtomicUsize::new(0),
            failure: Mutex::new(None),
        });
        let limit = config.schedule.max_batch.saturating_add(config.max_queue);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("mlx-spec-engine".into())
            .spawn(move || {
                let Loaded {
                    target,
                    providers,
                    factory,
                    prefix_store,
                } = match load() {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                // Shared from here on: the prefix cache keys saved draft
                // states by these addresses.
                let providers: Vec<Rc<dyn DraftProvider>> =
                    providers.into_iter().map(Rc::from).collect();
                let mut prefix = PrefixCache::new(config.prefix_cache);
                if let Some(store) = prefix_store {
                    let rule = Boundaries::of(target.as_ref(), config.schedule.prefill_chunk);
                    let views: Vec<&dyn DraftProvider> =
                        providers.iter().map(|p| p.as_ref()).collect();
                    prefix = prefix.with_store(store, target.as_ref(), rule, &views);
                }
                if ready_tx.send(Ok(())).is_err() {
                    return;
                }
                // A panic ends the thread's requests (their channels
                // drop) and is kept for `Engine::failure`; what is queued
                // or submitted later fails naming it.
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serve(
                        target.as_ref(),
                        providers,
                        factory.as_ref(),
                        prefix,
                        &config,
                        &inbox,
                        &thread_shared,
                    );
                }));
                if let Err(payload) = served {
                    let message = panic_message(payload.as_ref());
                    tracing::error!(panic = %message, "the engine thread panicked: it serves no more requests");
                    *thread_shared
                        .failure
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(message.clone());
                    for command in inbox.try_iter() {
                        if let Command::Submit(job) = command {
                            let _ = job.events.send(Event::Failed(ServeError::Panicked(message.clone())));
                        }
                    }
                }
            })
            .map_err(|e| ServeError::Load(Box::new(e)))?;
        let joined = |thread: JoinHandle<()>| {
            if thread.join().is_err() {
                tracing::error!("the engine thread panicked");
            }
        };
        match ready.recv() {
            Ok(Ok(())) => Ok(Engine {
                commands,
                shared,
                thread: Some(thread),
                limit,
            }),
            Ok(Err(e)) => {
                joined(thread);
                Err(ServeError::Load(e))
            }
            Err(_) => {
                joined(thread);
                Err(ServeError::Stopped)
            }
        }
    }

    /// Queues a request; refused with [`ServeError::Busy`] when
    /// `max_batch + max_queue` requests are already held. Its speculation
    /// names a loaded provider, or one the [`Loaded::factory`] builds for
    /// its options. The handle cancels through the request's own
    /// [`Request::cancel`] flag when it brings one.
    pub fn submit(&self, mut request: Request) -> Result<RequestHandle, ServeError> {
        let held = self.shared.held.fetch_add(1, Ordering::SeqCst);
        if held >= self.limit {
            self.shared.held.fetch_sub(1, Ordering::SeqCst);
            return Err(ServeError::Busy { limit: self.limit });
        }
        let (events, stream) = channel();
        let cancel = Arc::clone(request.cancel.get_or_insert_with(Default::default));
        let job = Job {
            request,
            events,
            cancel: Arc::clone(&cancel),
            submitted: Instant::now(),
        };
        if let Some(message) = self.failure() {
            self.shared.held.fetch_sub(1, Ordering::SeqCst);
            return Err(ServeError::Panicked(message));
        }
        if self.commands.send(Command::Submit(Box::new(job))).is_err() {
            self.shared.held.fetch_sub(1, Ordering::SeqCst);
            return Err(self
                .failure()
                .map_or(ServeError::Stopped, ServeError::Panicked));
        }
        Ok(RequestHandle {
            cancel,
            events: stream,
            ended: false,
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        self.shared
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The message of the panic that stopped the engine thread, if one
    /// did: the engine then serves nothing more (a host reports itself
    /// unhealthy and exits).
    pub fn failure(&self) -> Option<String> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Requests submitted and not yet ended.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Stops the engine: requests still held end cancelled, then the
    /// thread exits and is joined.
    pub fn shutdown(mut self) -> Result<(), ServeError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ServeError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let _ = self.commands.send(Command::Shutdown);
        thread.join().map_err(|_| ServeError::Stopped)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "the engine thread panicked");
        }
    }
}

/// The text a panic carried (`panic!` with a literal or a format).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// A request in the scheduler, as the engine thread tracks it.
struct Live {
    events: Sender<Event>,
    submitted: Instant,
    /// The provider its source was opened with, held while it runs: a
    /// built provider dropped from the set meanwhile stays alive (retired)
    /// until its last request ends.
    _provider: Option<Rc<dyn DraftProvider>>,
}

/// What the engine thread serves requests with.
struct Models<'a> {
    target: &'a dyn Target,
    providers: HashMap<String, Rc<dyn DraftProvider>>,
    factory: Option<&'a ProviderFactory>,
    built: ProviderSlots,
}

/// The engine thread's loop: take commands, admit, step, hand out the
/// ends, until shutdown (or every sender is gone). A request that needs a
/// provider built for its options is admitted as soon as it is built: the
/// least recently used built provider makes room, and the requests that
/// run on it go on (they hold it).
fn serve(
    target: &dyn Target,
    providers: Vec<Rc<dyn DraftProvider>>,
    factory: Option<&ProviderFactory>,
    prefix: PrefixCache,
    config: &EngineConfig,
    inbox: &Receiver<Command>,
    shared: &Shared,
) {
    let mut models = Models {
        target,
        providers: providers
            .into_iter()
            .map(|p| (p.id().to_owned(), p))
            .collect(),
        factory,
        built: ProviderSlots::new(config.built_providers),
    };
    let mut backlog = VecDeque::new();
    let mut scheduler = match Scheduler::new(target, config.schedule.clone()) {
        Ok(s) => s
            .with_prefix_cache_from(prefix)
            .with_shared_prefill(config.shared_prefill),
        Err(e) => {
            tracing::error!(error = %e, "the engine's schedule is invalid");
            return;
        }
    };
    let mut live: HashMap<JobId, Live> = HashMap::new();
    let mut stopping = false;
    while !stopping {
        if scheduler.is_idle() && backlog.is_empty() {
            match inbox.recv() {
                Ok(command) => take(command, &mut backlog, &mut stopping),
                Err(_) => stopping = true,
            }
        }
        for command in inbox.try_iter() {
            take(command, &mut backlog, &mut stopping);
        }
        // Admitted even when stopping: a shutdown ends them as cancelled.
        while let Some(job) = backlog.pop_front() {
            admit(job, &mut models, &mut scheduler, &mut live, shared);
        }
        release(&mut models.built, &mut scheduler);
        if stopping {
            break;
        }
        if backlog.is_empty() {
            // Plain decoding requests (alone or together) decode pipelined
            // until a command comes.
            let mut interrupt = || match inbox.try_recv() {
                Ok(command) => {
                    take(command, &mut backlog, &mut stopping);
                    true
                }
                Err(TryRecvError::Empty) => false,
                Err(TryRecvError::Disconnected) => {
                    stopping = true;
                    true
                }
            };
            if let Some(lone) = scheduler.decode_pipelined(&mut interrupt) {
                {
                    let mut stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
                    let forwards = lone.forwards as u64;
                    stats.steps += forwards;
                    if lone.rows == 1 {
                        stats.lone_steps += forwards;
                    } else {
                        stats.pipelined_steps += forwards;
                    }
                    if forwards > 0 && stats.rows_per_step.len() <= lone.rows {
                        stats.rows_per_step.resize(lone.rows + 1, 0);
                    }
                    if let Some(k) = stats.rows_per_step.get_mut(lone.rows) {
                        *k += forwards;
                    }
                    stats.prefix_cache = scheduler.prefix_cache_stats();
                }
                for finished in lone.finished {
                    deliver(finished, &mut live, shared);
                }
                continue;
            }
        }
        let report = scheduler.step();
        if report.rows > 0 || !report.finished.is_empty() {
            let mut stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.prefix_cache = scheduler.prefix_cache_stats();
        }
        if report.rows > 0 {
            let mut stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.steps += 1;
            if stats.rows_per_step.len() <= report.rows {
                stats.rows_per_step.resize(report.rows + 1, 0);
            }
            stats.rows_per_step[report.rows] += 1;
            stats.step_cost = scheduler.step_cost_stats();
        }
        for finished in report.finished {
            deliver(finished, &mut live, shared);
        }
    }
    for finished in scheduler.close_all() {
        deliver(finished, &mut live, shared);
    }
    // Submissions that arrived after the shutdown.
    let late = inbox.try_iter().filter_map(|c| match c {
        Command::Submit(job) => Some(*job),
        Command::Shutdown => None,
    });
    for job in backlog.into_iter().chain(late) {
        let _ = job.events.send(Event::Failed(ServeError::Stopped));
        shared.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Drops the retired providers no request holds any more, with the draft
/// states the prefix cache kept under their address (which a provider
/// built later may take).
fn release(built: &mut ProviderSlots, scheduler: &mut Scheduler<'_>) {
    for provider in built.take_released() {
        scheduler.forget_drafts_of(&crate::prefix_cache::state_key(provider.as_ref()));
        tracing::debug!(id = provider.id(), "retired provider released");
    }
}

fn take(command: Command, backlog: &mut VecDeque<Job>, stopping: &mut bool) {
    match command {
        Command::Shutdown => *stopping = true,
        Command::Submit(job) => backlog.push_back(*job),
    }
}

/// The provider a request names: a loaded one, or one built for its
/// options (kept for later requests with the same options).
fn provider_of(
    choice: &ProviderChoice,
    models: &mut Models<'_>,
) -> Result<Rc<dyn DraftProvider>, ServeError> {
    if choice.options.is_empty() {
        return models.providers.get(&choice.id).cloned().ok_or_else(|| {
            let mut loaded: Vec<&str> = models.providers.keys().map(String::as_str).collect();
            loaded.sort_unstable();
            ServeError::NoSuchProvider {
                id: choice.id.clone(),
                loaded: loaded.join(", "),
            }
        });
    }
    let Some(factory) = models.factory else {
        return Err(ServeError::Config(format!(
            "provider `{}` was given options, and this engine builds no providers",
            choice.id
        )));
    };
    if let Some(provider) = models.built.find(&choice.id, &choice.options) {
        return Ok(provider);
    }
    let provider = factory(&choice.id, models.target, &choice.options).map_err(|source| {
        ServeError::Build {
            provider: choice.id.clone(),
            source,
        }
    })?;
    Ok(models.built.insert(&choice.id, &choice.options, provider))
}

/// Builds a submitted request's state and queues it; a request that cannot
/// start fails at once.
fn admit<'a>(
    job: Job,
    models: &mut Models<'a>,
    scheduler: &mut Scheduler<'a>,
    live: &mut HashMap<JobId, Live>,
    shared: &Shared,
) {
    let Job {
        request,
        events,
        cancel,
        submitted,
    } = job;
    let stream = events.clone();
    match state_of(request, events.clone(), cancel, models, scheduler) {
        Ok((state, provider)) => {
            let id = scheduler.enqueue(state);
            live.insert(
                id,
                Live {
                    events,
                    submitted,
                    _provider: provider,
                },
            );
        }
        Err(e) => {
            // Counted before the stream hears it: a reader then sees it gone.
            shared.held.fetch_sub(1, Ordering::SeqCst);
            shared
                .stats
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .failed += 1;
            let _ = stream.send(Event::Failed(e));
        }
    }
}

fn state_of<'a>(
    request: Request,
    events: Sender<Event>,
    cancel: Arc<AtomicBool>,
    models: &mut Models<'a>,
    scheduler: &mut Scheduler<'a>,
) -> Result<(RequestState<'a>, Option<Rc<dyn DraftProvider>>), ServeError> {
    let target = models.target;
    if let Some(context) = target.info().context_length {
        if request.prompt.len().saturating_add(request.max_tokens) > context {
            return Err(ServeError::TooLong {
                prompt: request.prompt.len(),
                max_tokens: request.max_tokens,
                context,
            });
        }
    }
    let provider = match &request.speculation {
        Some(choice) => Some(provider_of(choice, models)?),
        None => None,
    };
    let on_token = Box::new(move |e: &crate::Emitted<'_>| {
        let event = Event::Token {
            token: e.token,
            logprob: e.logprob,
            top_logprobs: e.top_logprobs.to_vec(),
        };
        if events.send(event).is_err() {
            // The reader went away: free the row at the next step.
            cancel.store(true, Ordering::Relaxed);
        }
        ControlFlow::Continue(())
    });
    let chunk = scheduler.config().prefill_chunk;
    let state = RequestState::new(
        target,
        request,
        provider.as_deref(),
        None,
        on_token,
        chunk,
        scheduler.reuse(),
    )?;
    Ok((state, provider))
}

/// Sends a request's end to its stream and counts it.
fn deliver(finished: Finished, live: &mut HashMap<JobId, Live>, shared: &Shared) {
    let Some(Live {
        events, submitted, ..
    }) = live.remove(&finished.id)
    else {
        return;
    };
    shared.held.fetch_sub(1, Ordering::SeqCst);
    let mut stats = shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
    let since = |t: Instant| t.saturating_duration_since(submitted).as_secs_f64();
    let event = match finished.result {
        Ok(output) => {
            let queue_seconds = finished.joined.map_or(0.0, since);
            let first_token_seconds = finished.first_token.map(since);
            stats.completed += 1;
            stats.cancelled += u64::from(output.finish == crate::Finish::Cancelled);
            stats.queue_seconds += queue_seconds;
            if let Some(s) = first_token_seconds {
                stats.first_token_seconds += s;
                stats.first_tokens += 1;
            }
            Event::Done(Box::new(Completion {
                output,
                queue_seconds,
                first_token_seconds,
            }))
        }
        Err(e) => {
            stats.failed += 1;
            Event::Failed(e)
        }
    };
    drop(stats);
    let _ = events.send(event);
}
