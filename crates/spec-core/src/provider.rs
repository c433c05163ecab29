//! Draft providers and their per-request sources: the proposer side of
//! speculative decoding. A provider is loaded once per target model; `open`
//! makes a source for one request, which the serve loop drives through
//! `prefill`, then rounds of `draft` and `commit`.

use mlx_rs::Array;

use crate::{Sampler, SpecError, Target};

/// How the serve loop prefills the prompt for a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillMode {
    /// Prefill `prompt[..len-1]`; the last prompt token is pending and the
    /// first emitted token comes from the first verify window (mlx-lm's way).
    #[default]
    TailSplit,
    /// Prefill the whole prompt and sample the first token from its last
    /// position (the last prompt token runs alone, as plain decoding's first
    /// step does, so its row gets the same bits in both modes).
    Full,
}

/// What `draft` is given each round.
#[derive(Debug)]
pub struct DraftRequest<'a> {
    /// `[pending]` after a rejection or on the first round; `[last draft,
    /// bonus]` after a round in which every draft was accepted.
    pub feed: &'a [u32],
    /// Most tokens to propose (at least 1).
    pub max_tokens: usize,
    /// The target's post-norm hidden state `[1, 1, H]` at the position that
    /// predicted the pending token, when known.
    pub anchor_hidden: Option<&'a Array>,
    /// Every token of the request so far (prompt, then generated), ending
    /// with the pending token.
    pub history: &'a [u32],
    /// The target's caches as of the last commit, read-only: the donors of a
    /// drafter that attends over the target's own keys and values.
    pub target_caches: Option<&'a crate::CacheSet>,
}

/// A proposal: its length is authoritative (0 means "plain target step").
#[derive(Debug, Default)]
pub struct Draft {
    /// The proposed tokens.
    pub tokens: Vec<u32>,
    /// The draft distribution each token was sampled from, as probabilities
    /// `[d, V]`, for lossless rejection sampling; `None` means the proposal
    /// is deterministic (a point mass on each token).
    pub probs: Option<Array>,
}

/// What `commit` is told after verification.
#[derive(Debug)]
pub struct CommitInfo<'a> {
    /// Tokens drafted this round.
    pub drafted: usize,
    /// Leading drafts the target accepted (`0..=drafted`).
    pub accepted: usize,
    /// The accepted tokens, `drafted[..accepted]`.
    pub accepted_tokens: &'a [u32],
    /// Tokens the host appended after the source's drafts (a constraint's
    /// forced tokens) that the target accepted, in order after
    /// `accepted_tokens`. Always empty for a source whose
    /// [`DraftSource::takes_foreign_tokens`] is false. Otherwise non-empty
    /// only when every draft the host verified was accepted (drafts a
    /// constraint refused before verification count as rejected): the
    /// round's output is then `accepted_tokens`, `foreign`, `next`.
    pub foreign: &'a [u32],
    /// The token the target emitted after the accepted tokens (correction
    /// or bonus), after `foreign` when there are some.
    pub next: u32,
    /// The target's tapped hidden states over the verify window, when the
    /// source asked for taps: `[1, verified + 1, taps * H]`, where the host
    /// verified `verified` drafts, `accepted <= verified <= drafted` (a
    /// request's constraint may refuse the last drafts before
    /// verification: they count as rejected). With `foreign` tokens,
    /// `[1, accepted + foreign.len() + 1, taps * H]`: the pending token's
    /// position, the accepted drafts' and the foreign tokens'.
    pub verified_taps: Option<&'a Array>,
    /// The target's post-norm hidden states over the verify window,
    /// `[1, verified + 1, H]` (as `verified_taps`, foreign tokens
    /// included).
    pub verified_hidden: &'a Array,
}

/// How a request ended, as its source is told by [`DraftSource::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// It ran to its end (EOS, max tokens or a stop from the host): every
    /// token committed so far is part of the answer.
    Completed,
    /// It was cancelled (or its client went away).
    Cancelled,
    /// It failed with an error.
    Failed,
}

/// Who a request is for, as the host knows it; given to
/// [`DraftProvider::open_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenContext {
    /// The tenant the request belongs to (the server passes an identity of
    /// the caller's API key), for providers that keep state across requests
    /// and may be asked to keep tenants apart; `None` when the host has no
    /// notion of tenants.
    pub tenant: Option<String>,
    /// What the request expects its output to be, as tokens (OpenAI's
    /// predicted outputs); empty when it gave none. Providers that draft
    /// from text may draft from it; the output never depends on it.
    pub prediction: Vec<u32>,
}

/// A source's prefix-dependent state, saved right after its `prefill` so a
/// later request whose prompt starts with the same tokens can start from it
/// ([`DraftSource::save_prefill`], [`DraftSource::prefill_from`]). Read-only
/// once saved: many later requests may start from it.
pub trait SavedDraft: std::fmt::Debug {
    /// Prompt tokens the state covers (`prompt[..tokens]` of the request
    /// that saved it).
    fn tokens(&self) -> usize;
    /// Bytes held (counted against the host's prefix-cache budget).
    fn nbytes(&self) -> usize;
    /// The concrete state, for the provider that saved it.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Its persistent form, for a host that keeps prefix-cache entries
    /// across restarts (a server's prompt-cache directory): the state's
    /// arrays evaluated and copied out of MLX on this thread, to be written
    /// from any thread and read back by [`DraftProvider::load_saved`].
    /// `None` (the default): not persisted, so after a restart the
    /// provider's sources prefill cold.
    fn persist(&self) -> Option<Result<Box<dyn PersistedDraft>, SpecError>> {
        None
    }
}

/// A [`SavedDraft`] as plain data ([`SavedDraft::persist`]), no MLX array
/// in it, so a host may write it from another thread.
pub trait PersistedDraft: Send + std::fmt::Debug {
    /// Bytes it holds.
    fn nbytes(&self) -> usize;
    /// Writes it to `path` (a file the host names beside its entry),
    /// replacing any file there atomically: a reader never sees half a
    /// file under that name.
    fn write(&self, path: &std::path::Path) -> Result<(), SpecError>;
}

/// Checks a round's `history` and `feed` against the tokens a source has
/// seen so far (`seen`: the prompt, then its commits), for sources that keep
/// their own copy of the sequence: `history` must extend `seen` (only its
/// part past `checked`, which earlier rounds verified, is compared) and end
/// with `feed`. A [`SpecError::Protocol`] names the first disagreement.
pub fn check_history(
    seen: &[u32],
    checked: usize,
    history: &[u32],
    feed: &[u32],
) -> Result<(), SpecError> {
    if history.len() < seen.len() {
        return Err(SpecError::Protocol(format!(
            "history has {} tokens but the source has already seen {} (prompt and commits)",
            history.len(),
            seen.len()
        )));
    }
    let from = checked.min(seen.len());
    if let Some(offset) = seen[from..]
        .iter()
        .zip(&history[from..])
        .position(|(a, b)| a != b)
    {
        let at = from + offset;
        return Err(SpecError::Protocol(format!(
            "history differs from the prompt and commits the source has seen at position {at}: token {} in history, {} seen",
            history[at], seen[at]
        )));
    }
    if !history.ends_with(feed) {
        return Err(SpecError::Protocol(format!(
            "history does not end with the feed {feed:?}"
        )));
    }
    Ok(())
}

/// A per-request proposer.
pub trait DraftSource {
    /// How the serve loop should prefill.
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::TailSplit
    }
    /// Whether every round drafts the full draft length even when fewer
    /// tokens remain to emit (optiq's `spec_generate` shape; the extra
    /// drafts are verified, counted, and never emitted).
    fn drafts_past_max_tokens(&self) -> bool {
        false
    }
    /// Whether the source catches up from [`DraftRequest::history`] with
    /// tokens committed past what [`DraftSource::commit`] told it: a host
    /// may then append tokens of its own after the source's drafts (a
    /// constraint's forced tokens) and report the first of them as the
    /// round's `next`. Sources whose state is the history (prompt lookup,
    /// suffix decoding) or that can run what they missed (a draft model)
    /// can; a head anchored on the target's hidden states cannot: it takes
    /// such tokens through [`DraftSource::takes_foreign_tokens`].
    fn syncs_from_history(&self) -> bool {
        false
    }
    /// Whether the source takes tokens a host appends after its drafts (a
    /// constraint's forced tokens) from [`CommitInfo::foreign`], with the
    /// verified hidden states and taps that cover them, and leaves its
    /// state as a round in which it had drafted them and seen them
    /// accepted would leave it (a head anchored on the target's hidden
    /// states extends its cache or context over them as over accepted
    /// drafts). A host appends tokens of its own after a source's drafts
    /// only when this or [`DraftSource::syncs_from_history`] holds, and
    /// fills `foreign` only when this holds: a source that keeps the
    /// default (false) never sees it non-empty, so it cannot misread a
    /// round. Where both hold, `foreign` is used.
    fn takes_foreign_tokens(&self) -> bool {
        false
    }
    /// Whether a draft costs next to nothing beside a target step (a lookup
    /// in the history, no model forward), so a host may draft at a round's
    /// full length before it decides how much of the draft to verify: the
    /// goodput policy then sizes each step from the drafts that exist (a
    /// row whose lookup finds nothing costs nothing) instead of from what
    /// each row might draft. The drafts a host leaves out of the window are
    /// reported as rejected ([`CommitInfo::accepted`] stops before them), as
    /// drafts a constraint refuses are.
    fn cheap_to_draft(&self) -> bool {
        false
    }
    /// Target layers whose outputs the source consumes.
    fn tap_layers(&self) -> &[usize] {
        &[]
    }
    /// Sees the prompt (and, with taps, the prefill's tapped hidden states
    /// `[1, L, taps * H]`) before the first round.
    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError>;
    /// Proposes up to `request.max_tokens` tokens, sampling with the
    /// request's sampler.
    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError>;
    /// Learns the verification outcome of the last draft.
    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError>;
    /// Its prefix-dependent state right after [`DraftSource::prefill`], for a
    /// host's prefix cache; `None` (the default) when the source cannot save
    /// it (or has nothing worth saving: then a later request's source simply
    /// prefills the whole prompt again).
    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        None
    }
    /// Instead of [`DraftSource::prefill`]: starts from `saved` (a state a
    /// source of the same provider saved for a prompt whose first `keep`
    /// tokens equal `prompt[..keep]`, `keep <= saved.tokens()`) and prefills
    /// the rest of `prompt`, ending in the state `prefill(prompt, taps)`
    /// gives, bit for bit. `Ok(false)` (the default) when it cannot: the
    /// host then calls `prefill`.
    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
    ) -> Result<bool, SpecError> {
        let _ = (saved, keep, prompt, taps);
        Ok(false)
    }
    /// Told once, when the request ends, how it ended (after its last
    /// commit). A source that keeps state beyond the request (a provider-wide
    /// index) publishes it here only for `Completed`. The default does
    /// nothing.
    fn finish(&mut self, outcome: RequestOutcome) {
        let _ = outcome;
    }
}

/// A drafter loaded for one target model.
pub trait DraftProvider {
    /// Registered id.
    fn id(&self) -> &str;
    /// Draft tokens per round when the request names no count (mlx-lm's
    /// default of 3). A drafter whose tokens cost nothing to propose may
    /// ask for more: the serve loop's adaptive controller starts short and
    /// only reaches this length while drafts keep being accepted.
    fn default_num_draft(&self) -> usize {
        3
    }
    /// A source for one request against `target`. The source may borrow
    /// the target, never the provider: what it needs of the provider it
    /// owns (a copy of the settings, an `Rc` of the weights), so a host may
    /// drop or replace a provider while requests it opened still run.
    fn open<'t>(&self, target: &'t dyn Target) -> Result<Box<dyn DraftSource + 't>, SpecError>;
    /// A source for one request, knowing who it is for. Hosts call this;
    /// the default ignores the context and calls [`DraftProvider::open`].
    fn open_with<'t>(
        &self,
        target: &'t dyn Target,
        context: &OpenContext,
    ) -> Result<Box<dyn DraftSource + 't>, SpecError> {
        let _ = context;
        self.open(target)
    }
    /// Reads back a state a source of this provider saved and
    /// [`PersistedDraft::write`] wrote to `path`, kept with a host's entry
    /// holding `tokens` (the state covers a prefix of them). `Ok(None)`
    /// (the default) when this provider does not persist states, or when
    /// the file belongs to another configuration of it (another drafter
    /// model) or to other tokens; an error when the file is unreadable.
    fn load_saved(
        &self,
        path: &std::path::Path,
        tokens: &[u32],
    ) -> Result<Option<Box<dyn SavedDraft>>, SpecError> {
        let _ = (path, tokens);
        Ok(None)
    }
}
