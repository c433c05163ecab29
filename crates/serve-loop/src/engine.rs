//! One request: prefill, then rounds of draft -> verify -> accept ->
//! rollback -> commit -> emit, until EOS, max tokens, a stop from the host
//! or cancellation.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{
    CommitInfo, Draft, DraftProvider, DraftRequest, DraftSource, LogitsProcessor, PrefillMode,
    RequestOutcome, Sampler, SpecError, Target,
};

use crate::verify::{judge, sample, Verdict};
use crate::{DraftController, ServeError, SpecConfig, VerifyMode};
use spec_core::SpecStats;

const PREFILL_CHUNK: usize = 2048;

/// The provider a request speculates with, and how.
pub struct Speculation<'a> {
    /// The provider (its source is opened for this request).
    pub provider: &'a dyn DraftProvider,
    /// Settings.
    pub config: SpecConfig,
}

impl std::fmt::Debug for Speculation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("provider", &self.provider.id())
            .field("config", &self.config)
            .finish()
    }
}

/// One generation request.
pub struct Request<'a> {
    /// Prompt token ids (at least one).
    pub prompt: &'a [u32],
    /// Most tokens to emit (drafts included: never more).
    pub max_tokens: usize,
    /// Tokens that end the request (never emitted).
    pub is_eos: &'a dyn Fn(u32) -> bool,
    /// The request's sampler, shared by drafting and verification.
    pub sampler: &'a mut dyn Sampler,
    /// Applied to the logits of every verified position before sampling.
    pub processors: &'a mut [Box<dyn LogitsProcessor>],
    /// Speculation; `None` decodes plainly.
    pub speculation: Option<Speculation<'a>>,
    /// Checked between rounds; set to stop the request.
    pub cancel: Option<&'a AtomicBool>,
    /// Who the request is for (the provider's [`spec_core::OpenContext`]).
    pub tenant: Option<&'a str>,
    /// Caches already holding `prompt[..offset]` (a prompt-cache file):
    /// prefill skips those tokens. An error if `offset >= prompt.len()`, or
    /// with a provider that reads tapped layers (it cannot see the cached
    /// part's).
    pub prefix: Option<spec_core::CacheSet>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("speculation", &self.speculation)
            .finish_non_exhaustive()
    }
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token.
    Eos,
    /// `max_tokens` emitted.
    MaxTokens,
    /// The host's token callback asked to stop (e.g. a stop string).
    Stopped,
    /// The cancel flag was set.
    Cancelled,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Output {
    /// Emitted tokens.
    pub tokens: Vec<u32>,
    /// Log-probability of each emitted token under the target's processed
    /// distribution at its position (the verify window's, when speculating).
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: Finish,
    /// Speculation statistics.
    pub stats: SpecStats,
    /// Seconds until the first token was known (prompt processing).
    pub prompt_seconds: f64,
    /// Seconds of generation after that.
    pub generation_seconds: f64,
}

/// Rolls every cache back to `offset`, the start of a round that failed
/// (the verify forward may have appended to some caches and not others; a
/// failed trim may have trimmed some), as far as each cache can.
fn roll_back(caches: &mut spec_core::CacheSet, offset: usize) {
    for i in 0..caches.len() {
        if let Some(cache) = caches.get_mut(i) {
            let extra = cache.offset().saturating_sub(offset);
            if extra > 0 {
                if let Err(e) = cache.trim(extra) {
                    tracing::warn!(cache = i, error = %e, "a failed round's cache could not be rolled back");
                }
            }
        }
    }
}

/// A fallible step inside a speculative round: on failure the caches go back
/// to the round's start offset before the error returns, so a failed round
/// leaves them as the last commit left them.
macro_rules! in_round {
    ($caches:expr, $start:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                roll_back(&mut $caches, $start);
                return Err(e.into());
            }
        }
    };
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

fn token_of(a: &Array) -> Result<u32, ServeError> {
    let a = a.as_dtype(Dtype::Uint32)?;
    a.eval()?;
    a.as_slice::<u32>()
        .first()
        .copied()
        .ok_or_else(|| ServeError::Spec(SpecError::Invalid("sampler returned no token".into())))
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
    Ok(row.subtract(row.logsumexp_axis(-1, true)?)?)
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
        .ok_or_else(|| ServeError::Spec(SpecError::Invalid("no log-probability".into())))
}

/// The emitted tokens and their log-probabilities.
#[derive(Default)]
struct Emitted {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Emits `token` unless it ends the request; returns how the request ends.
fn emit(
    token: u32,
    logprob: f32,
    out: &mut Emitted,
    history: &mut Vec<u32>,
    max_tokens: usize,
    is_eos: &dyn Fn(u32) -> bool,
    on_token: &mut impl FnMut(u32) -> ControlFlow<()>,
) -> Option<Finish> {
    if is_eos(token) {
        return Some(Finish::Eos);
    }
    out.tokens.push(token);
    out.logprobs.push(logprob);
    history.push(token);
    if on_token(token).is_break() {
        return Some(Finish::Stopped);
    }
    if out.tokens.len() >= max_tokens {
        return Some(Finish::MaxTokens);
    }
    None
}

/// Plain decoding without logits processors, pipelined as mlx-lm does: the
/// next step's forward is queued (on the lazily sampled token) before the
/// current token is read back, so the CPU never idles between steps.
#[allow(clippy::too_many_arguments)]
fn plain_pipelined(
    target: &dyn Target,
    caches: &mut spec_core::CacheSet,
    pending: u32,
    max_tokens: usize,
    is_eos: &dyn Fn(u32) -> bool,
    sampler: &mut dyn Sampler,
    cancel: Option<&AtomicBool>,
    emitted: &mut Emitted,
    history: &mut Vec<u32>,
    stats: &mut SpecStats,
    on_token: &mut impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Finish, ServeError> {
    let mut step = |input: &Array, stats: &mut SpecStats| -> Result<(Array, Array), ServeError> {
        let out = target.decode(&input.reshape(&[1, 1])?, caches, &[])?;
        let logits = target.logits(&out.hidden.index((.., -1, ..)))?;
        let lp = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        stats.record_round(0, 0);
        let y = sampler.sample(&lp)?.as_dtype(Dtype::Uint32)?;
        let chosen = lp.take_along_axis(y.reshape(&[1, 1])?, -1)?;
        mlx_rs::transforms::async_eval([&y, &chosen])?;
        Ok((y, chosen))
    };
    let mut y = step(&Array::from_slice(&[pending], &[1]), stats)?;
    loop {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            mlx_rs::transforms::eval([&y.0, &y.1])?;
            return Ok(Finish::Cancelled);
        }
        // Queue the next step before waiting on this one (unless this is the last).
        let next = if emitted.tokens.len() + 1 < max_tokens {
            Some(step(&y.0, stats)?)
        } else {
            None
        };
        let token = token_of(&y.0)?;
        mlx_rs::transforms::eval([&y.1])?;
        let logprob = y.1.as_slice::<f32>().first().copied().unwrap_or(f32::NAN);
        if let Some(finish) = emit(
            token, logprob, emitted, history, max_tokens, is_eos, on_token,
        ) {
            // Never leave the queued step running behind our back: a process
            // that exits while MLX still computes on its stream thread can
            // deadlock in OpenBLAS's shutdown or corrupt the heap (seen).
            if let Some((n, c)) = &next {
                mlx_rs::transforms::eval([n, c])?;
            }
            return Ok(finish);
        }
        match next {
            Some(n) => y = n,
            None => return Ok(Finish::MaxTokens),
        }
    }
}

/// Runs one request, calling `on_token` with each emitted token.
pub fn generate(
    target: &dyn Target,
    req: Request<'_>,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Output, ServeError> {
    let Request {
        prompt,
        max_tokens,
        is_eos,
        sampler,
        processors,
        speculation,
        cancel,
        tenant,
        prefix,
    } = req;
    if prompt.is_empty() {
        return Err(ServeError::EmptyPrompt);
    }
    if let Some(cached) = prefix.as_ref().map(spec_core::CacheSet::offset) {
        if cached >= prompt.len() {
            return Err(ServeError::PrefixTooLong {
                cached,
                prompt: prompt.len(),
            });
        }
    }
    let (mut source, config): (Option<Box<dyn DraftSource + '_>>, SpecConfig) = match &speculation {
        Some(s) => {
            let context = spec_core::OpenContext {
                tenant: tenant.map(str::to_string),
            };
            (
                Some(s.provider.open_with(target, &context)?),
                s.config.clone(),
            )
        }
        None => (None, SpecConfig::default()),
    };
    let _span = tracing::info_span!(
        "generate",
        prompt = prompt.len(),
        max_tokens,
        provider = speculation.as_ref().map(|s| s.provider.id())
    )
    .entered();
    let mut retired: Option<Box<dyn DraftSource + '_>> = None;
    let result = (|| -> Result<Output, ServeError> {
        let mode = source
            .as_ref()
            .map_or(PrefillMode::TailSplit, |s| s.prefill_mode());
        let taps: Vec<usize> = source
            .as_ref()
            .map_or_else(Vec::new, |s| s.tap_layers().to_vec());
        let mut controller = DraftController::new(config.num_draft, config.adaptive.clone());
        let rejection = config.verify == VerifyMode::Rejection && !sampler.is_greedy();
        let mut rng = StdRng::seed_from_u64(config.seed);
        let mut stats = SpecStats::default();
        let skip = prefix.as_ref().map_or(0, spec_core::CacheSet::offset);
        if skip > 0 && !taps.is_empty() {
            return Err(ServeError::PrefixWithTaps {
                provider: speculation
                    .as_ref()
                    .map_or("?", |s| s.provider.id())
                    .to_owned(),
            });
        }
        let mut caches = prefix.unwrap_or_else(|| target.make_caches());
        let mut history: Vec<u32> = prompt.to_vec();
        let mut emitted = Emitted::default();
        let start = Instant::now();

        // Prefill. Both modes run `prompt[..len-1]` in fixed chunks; a full
        // prefill then runs the last prompt token alone, exactly the forward
        // plain decoding's first step makes, so every prompt row gets the same
        // bits in either mode (a prompt chunk may be computed in another form
        // than decoding rows: GLM's, or any product sent to the BLAS by
        // `MLX_SPEC_GEMM_MAX_M`).
        let (body, last) = prompt.split_at(prompt.len() - 1);
        let chunks = body[skip..]
            .chunks(PREFILL_CHUNK)
            .chain((mode == PrefillMode::Full).then_some(last));
        let mut anchor: Option<Array> = None;
        let mut tapped = Vec::new();
        for chunk in chunks {
            let out = target.forward(&ids(chunk), &mut caches, &taps)?;
            out.hidden.eval()?;
            anchor = Some(out.hidden.index((.., -1.., ..)));
            if let Some(t) = out.taps {
                tapped.push(t);
            }
        }
        let ctx = if tapped.is_empty() {
            None
        } else {
            Some(concatenate(&tapped, 1)?)
        };
        if let Some(src) = source.as_mut() {
            src.prefill(prompt, ctx.as_ref())?;
        }
        let mut finish = None;
        let mut pending = prompt[prompt.len() - 1];
        if mode == PrefillMode::Full {
            let hidden = anchor.as_ref().ok_or_else(|| {
                ServeError::Spec(SpecError::Invalid(
                    "full prefill produced no hidden state".into(),
                ))
            })?;
            let lp = logprobs(
                &target.logits(hidden)?.index((.., -1, ..)),
                &history,
                processors,
            )?;
            let first = token_of(&sampler.sample(&lp)?)?;
            finish = emit(
                first,
                chosen_logprob(&lp, first)?,
                &mut emitted,
                &mut history,
                max_tokens,
                is_eos,
                &mut on_token,
            );
            pending = first;
        }
        let prompt_seconds = start.elapsed().as_secs_f64();
        let gen_start = Instant::now();
        if finish.is_none() && source.is_none() && processors.is_empty() {
            finish = Some(plain_pipelined(
                target,
                &mut caches,
                pending,
                max_tokens,
                is_eos,
                sampler,
                cancel,
                &mut emitted,
                &mut history,
                &mut stats,
                &mut on_token,
            )?);
        }
        let mut feed = vec![pending];

        while finish.is_none() {
            if emitted.tokens.len() >= max_tokens {
                finish = Some(Finish::MaxTokens);
                break;
            }
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                finish = Some(Finish::Cancelled);
                break;
            }
            let remaining = max_tokens - emitted.tokens.len();
            let mut n = match source.as_ref() {
                Some(src) if src.drafts_past_max_tokens() => controller.next_len(),
                Some(_) => controller.next_len().min(remaining),
                None => 0,
            };
            if n > 0 && !caches.can_trim_after(n + 1, n) {
                // Near a sliding window's end: draft only as far as the caches
                // can still roll back. Once a window has rotated nothing can be
                // rolled back: decode plainly from here.
                n = (1..n)
                    .rev()
                    .find(|&m| caches.can_trim_after(m + 1, m))
                    .unwrap_or(0);
                if n == 0 {
                    stats.untrimmable_fallback = true;
                    retired = source.take();
                }
            }
            // A failure anywhere in the round rolls the caches back to here.
            let round_start = caches.offset();
            let draft = match source.as_mut() {
                Some(src) if n > 0 => in_round!(
                    caches,
                    round_start,
                    src.draft(
                        DraftRequest {
                            feed: &feed,
                            max_tokens: n,
                            anchor_hidden: anchor.as_ref(),
                            history: &history,
                            target_caches: Some(&caches)
                        },
                        sampler,
                    )
                ),
                _ => Draft::default(),
            };
            let d = draft.tokens.len();
            if d > n {
                return Err(SpecError::Protocol(format!(
                    "source returned {d} drafts for at most {n}"
                ))
                .into());
            }
            let mut window = Vec::with_capacity(d + 1);
            window.push(pending);
            window.extend_from_slice(&draft.tokens);
            let out = in_round!(
                caches,
                round_start,
                target.decode(&ids(&window), &mut caches, &taps)
            );
            let logits = in_round!(caches, round_start, target.logits(&out.hidden));

            let mut accepted = 0;
            let mut next = None;
            let mut walked_logprobs = Vec::with_capacity(d + 1);
            let draft_probs = match (&draft.probs, rejection) {
                (Some(q), true) => Some(in_round!(caches, round_start, host_probs(q))),
                _ => None,
            };
            let vocab = logits.shape().last().copied().unwrap_or(0) as usize;
            // What the processors see at position i: the history, then drafts[..i].
            let mut hist = history.clone();
            for i in 0..=d {
                if i > 0 {
                    hist.push(draft.tokens[i - 1]);
                }
                let lp = in_round!(
                    caches,
                    round_start,
                    logprobs(&logits.index((.., i as i32, ..)), &hist, processors)
                );
                let t = if rejection {
                    let p = in_round!(
                        caches,
                        round_start,
                        sampler
                            .probabilities(&lp)
                            .map_err(ServeError::from)
                            .and_then(|p| host_probs(&p))
                    );
                    if i == d {
                        sample(&p, &mut rng)
                    } else {
                        let q = draft_probs.as_ref().map(|q| &q[i * vocab..(i + 1) * vocab]);
                        match judge(&p, q, draft.tokens[i], &mut rng) {
                            Verdict::Accept => draft.tokens[i],
                            Verdict::Replace(t) => t,
                        }
                    }
                } else {
                    in_round!(
                        caches,
                        round_start,
                        sampler
                            .sample(&lp)
                            .map_err(ServeError::from)
                            .and_then(|y| token_of(&y))
                    )
                };
                walked_logprobs.push(in_round!(caches, round_start, chosen_logprob(&lp, t)));
                if i < d && t == draft.tokens[i] {
                    accepted += 1;
                } else {
                    next = Some(t);
                    break;
                }
            }
            let next = in_round!(
                caches,
                round_start,
                next.ok_or_else(|| ServeError::Spec(SpecError::Invalid(
                    "verification produced no token".into()
                )))
            );
            stats.record_round(d, accepted);
            if accepted < d {
                in_round!(caches, round_start, caches.trim(d - accepted));
            }
            if let Some(src) = source.as_mut() {
                if d > 0 || n > 0 {
                    in_round!(
                        caches,
                        round_start,
                        src.commit(CommitInfo {
                            drafted: d,
                            accepted,
                            accepted_tokens: &draft.tokens[..accepted],
                            next,
                            verified_taps: out.taps.as_ref(),
                            verified_hidden: &out.hidden,
                        })
                    );
                }
            }
            controller.observe(d, accepted);
            anchor = Some(
                out.hidden
                    .index((.., accepted as i32..accepted as i32 + 1, ..)),
            );
            for (&t, &logprob) in draft.tokens[..accepted]
                .iter()
                .chain(std::iter::once(&next))
                .zip(&walked_logprobs)
            {
                finish = emit(
                    t,
                    logprob,
                    &mut emitted,
                    &mut history,
                    max_tokens,
                    is_eos,
                    &mut on_token,
                );
                if finish.is_some() {
                    break;
                }
            }
            pending = next;
            feed = if d > 0 && accepted == d {
                vec![draft.tokens[d - 1], next]
            } else {
                vec![next]
            };
        }
        stats.emitted = emitted.tokens.len();
        stats.paused = controller.paused();
        tracing::info!(
            drafted = stats.drafted,
            accepted = stats.accepted,
            rejected = stats.rejected,
            target_calls = stats.target_calls,
            rounds = stats.rounds,
            tokens_per_forward = stats.tokens_per_forward(),
            "speculation stats"
        );
        Ok(Output {
            tokens: emitted.tokens,
            logprobs: emitted.logprobs,
            finish: finish.unwrap_or(Finish::MaxTokens),
            stats,
            prompt_seconds,
            generation_seconds: gen_start.elapsed().as_secs_f64(),
        })
    })();
    if let Some(src) = source.as_mut().or(retired.as_mut()) {
        src.finish(match &result {
            Ok(out) if out.finish == Finish::Cancelled => RequestOutcome::Cancelled,
            Ok(_) => RequestOutcome::Completed,
            Err(_) => RequestOutcome::Failed,
        });
    }
    result
}
