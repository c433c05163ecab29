//! The per-request source of `draft-model`.

use std::rc::Rc;
use std::sync::Arc;

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{
    CacheSet, CommitInfo, Draft, DraftRequest, DraftSource, PersistedDraft, Sampler, SavedDraft,
    SpecError, Target,
};
use spec_formats::prompt_cache::{self, EncodedPromptCache, ModelIdentity};

const PREFILL_CHUNK: usize = 2048;

/// Drafts with the drafter's own cache; see the crate docs for the rewind rule.
#[derive(Debug)]
pub struct DraftModelSource {
    /// The drafter, shared with its provider (which may be dropped first).
    model: Rc<dyn Target>,
    caches: CacheSet,
    /// The last draft, until its commit.
    outstanding: Option<Round>,
    /// Whether a layer of the drafter slides over a window (its rounds
    /// keep the caches they start from: [`Round::before`]).
    windowed: bool,
    /// Set by a protocol violation: the cache may be out of step, so every
    /// later call fails instead of drafting from a wrong context.
    poisoned: Option<String>,
    /// The tokens the prefill ran (`prompt[..len-1]`), kept for a saved
    /// state's file.
    prefilled: Vec<u32>,
    /// The drafter as a persisted state names it (`None`: not persisted).
    identity: Option<Arc<ModelIdentity>>,
}

/// A round between its draft and its commit.
#[derive(Debug)]
struct Round {
    /// The drafts.
    tokens: Vec<u32>,
    /// What the drafter ran before its first draft.
    feed: Vec<u32>,
    /// The caches as they were before the round, where a sliding layer's
    /// cache may be unable to drop the rejected drafts (its window rotated
    /// while drafting one token at a time): the commit then starts from
    /// them again and replays what it keeps.
    before: Option<CacheSet>,
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

impl DraftModelSource {
    /// A source with an empty cache.
    pub fn new(model: Rc<dyn Target>) -> Self {
        let caches = model.make_caches();
        let windowed =
            (0..caches.len()).any(|i| caches.get(i).is_some_and(|c| c.window().is_some()));
        Self {
            caches,
            model,
            outstanding: None,
            windowed,
            poisoned: None,
            prefilled: Vec::new(),
            identity: None,
        }
    }

    /// Its saved states persist as prompt-cache files of the drafter
    /// `identity` names (`None`: they do not persist).
    pub fn persisting_as(mut self, identity: Option<Arc<ModelIdentity>>) -> Self {
        self.identity = identity;
        self
    }

    fn check_usable(&self) -> Result<(), SpecError> {
        match &self.poisoned {
            Some(why) => Err(SpecError::Protocol(format!(
                "source unusable after an earlier violation: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn poison(&mut self, why: String) -> SpecError {
        self.poisoned = Some(why.clone());
        SpecError::Protocol(why)
    }

    /// Tokens in the drafter's cache.
    pub fn cached(&self) -> usize {
        self.caches.offset()
    }
}

/// The drafter's caches right after a prefill: `prompt[..len-1]`, with
/// those tokens and the drafter's identity when the state may persist.
#[derive(Debug)]
struct SavedCaches {
    caches: CacheSet,
    tokens: Vec<u32>,
    identity: Option<Arc<ModelIdentity>>,
}

/// A state read back from its file (`DraftProvider::load_saved`).
pub(crate) fn saved_caches(
    caches: CacheSet,
    tokens: Vec<u32>,
    identity: Arc<ModelIdentity>,
) -> Box<dyn SavedDraft> {
    Box::new(SavedCaches {
        caches,
        tokens,
        identity: Some(identity),
    })
}

impl SavedDraft for SavedCaches {
    fn tokens(&self) -> usize {
        self.caches.offset()
    }
    fn nbytes(&self) -> usize {
        self.caches.nbytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    /// The drafter's cache as a prompt-cache file of the drafter (the
    /// format code of `spec_formats::prompt_cache`, one for every layout).
    fn persist(&self) -> Option<Result<Box<dyn PersistedDraft>, SpecError>> {
        let identity = self.identity.as_ref()?;
        if self.tokens.len() != self.caches.offset() {
            return None;
        }
        let encoded = prompt_cache::encode_prompt_cache(
            std::path::Path::new(super::ID),
            &self.caches,
            &self.tokens,
            identity,
            &std::collections::BTreeMap::new(),
        );
        Some(
            encoded
                .map(|e| Box::new(PersistedCaches(e)) as Box<dyn PersistedDraft>)
                .map_err(|e| SpecError::provider_failed(super::ID, e)),
        )
    }
}

/// [`SavedCaches`] encoded for its file.
#[derive(Debug)]
struct PersistedCaches(EncodedPromptCache);

impl PersistedDraft for PersistedCaches {
    fn nbytes(&self) -> usize {
        self.0.nbytes()
    }
    fn write(&self, path: &std::path::Path) -> Result<(), SpecError> {
        self.0
            .write_to(path)
            .map_err(|e| SpecError::provider_failed(super::ID, e))
    }
}

impl DraftModelSource {
    fn check_fresh(&self) -> Result<(), SpecError> {
        self.check_usable()?;
        if self.caches.offset() != 0 || self.outstanding.is_some() {
            return Err(SpecError::Protocol(
                "prefill on a source that already ran".into(),
            ));
        }
        Ok(())
    }

    /// Prefills `prompt[from..len-1]` on the fixed grid of `PREFILL_CHUNK`
    /// from the prompt's start (`from` on the grid), so the cache holds the
    /// bits of a prefill from the start.
    fn prefill_body(&mut self, prompt: &[u32], from: usize) -> Result<(), SpecError> {
        // Like the target under tail-split prefill: all but the last prompt
        // token, which is the first round's feed.
        let body = prompt.split_last().map_or(&[][..], |(_, body)| body);
        for chunk in body.get(from..).unwrap_or_default().chunks(PREFILL_CHUNK) {
            self.model
                .forward(&ids(chunk), &mut self.caches, &[])?
                .hidden
                .eval()?;
        }
        Ok(())
    }
}

impl DraftSource for DraftModelSource {
    fn syncs_from_history(&self) -> bool {
        // `draft` runs whatever the history holds past the drafter's cache.
        true
    }

    fn prefill(&mut self, prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        self.check_fresh()?;
        self.prefill_body(prompt, 0)?;
        self.prefilled = prompt[..prompt.len().saturating_sub(1)].to_vec();
        Ok(())
    }

    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        if self.outstanding.is_some() || self.poisoned.is_some() {
            return None;
        }
        Some(Box::new(SavedCaches {
            caches: self.caches.duplicate()?,
            tokens: self.prefilled.clone(),
            identity: self.identity.clone(),
        }))
    }

    /// Keeps the saved cache up to the last `PREFILL_CHUNK` grid point within
    /// `keep` (the rows a prefill from the start computes in the same
    /// chunks) and prefills the rest on the same grid.
    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        _taps: Option<&Array>,
    ) -> Result<bool, SpecError> {
        self.check_fresh()?;
        let Some(SavedCaches { caches, .. }) = saved.as_any().downcast_ref::<SavedCaches>() else {
            return Ok(false);
        };
        let body = prompt.len().saturating_sub(1);
        let grid = keep.min(body) / PREFILL_CHUNK * PREFILL_CHUNK;
        if grid == 0 || grid > caches.offset() {
            return Ok(false);
        }
        let Some(mut copy) = caches.duplicate() else {
            return Ok(false);
        };
        if copy.offset() > grid && copy.trim(copy.offset() - grid).is_err() {
            return Ok(false);
        }
        self.caches = copy;
        self.prefill_body(prompt, grid)?;
        self.prefilled = prompt[..body].to_vec();
        Ok(true)
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.check_usable()?;
        if self.outstanding.is_some() {
            return Err(self.poison("draft called before the previous draft was committed".into()));
        }
        if request.feed.is_empty() || request.max_tokens == 0 {
            return Err(SpecError::Protocol(format!(
                "draft needs a feed and n >= 1 (feed {:?}, n {})",
                request.feed, request.max_tokens
            )));
        }
        // The drafter runs every token its cache does not hold yet: the
        // feed, and before it any token the host committed past what
        // `commit` told (a constraint's forced tokens).
        let offset = self.caches.offset();
        let expected = request.history.len().saturating_sub(request.feed.len());
        if offset > expected || !request.history.ends_with(request.feed) {
            let why = format!(
                "drafter cache holds {offset} tokens but the request's history implies {expected} before the feed {:?}",
                request.feed
            );
            return Err(self.poison(why));
        }
        let mut tokens = Vec::with_capacity(request.max_tokens);
        let mut probs = Vec::new();
        let first = request.history[offset..].to_vec();
        let before = if self.windowed && request.max_tokens > 1 {
            self.caches.duplicate()
        } else {
            None
        };
        let mut feed = first.clone();
        for _ in 0..request.max_tokens {
            let out = self.model.forward(&ids(&feed), &mut self.caches, &[])?;
            let logits = self.model.logits(&out.hidden.index((.., -1, ..)))?;
            let logprobs = mlx_ext::softmax::log_softmax(&logits)?;
            let token = sampler.sample(&logprobs)?.as_dtype(Dtype::Uint32)?;
            token.eval()?;
            let t = token
                .as_slice::<u32>()
                .first()
                .copied()
                .ok_or(SpecError::Internal("sampler returned no token"))?;
            if !sampler.is_greedy() {
                probs.push(sampler.probabilities(&logprobs)?);
            }
            tokens.push(t);
            feed = vec![t];
        }
        // The last draft was produced, not fed: the cache holds the feed and
        // all drafts but the last.
        self.outstanding = Some(Round {
            tokens: tokens.clone(),
            feed: first,
            before,
        });
        let probs = if probs.is_empty() {
            None
        } else {
            Some(concatenate(&probs, 0)?)
        };
        Ok(Draft { tokens, probs })
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.check_usable()?;
        let Some(round) = self.outstanding.take() else {
            return Err(self.poison("commit without a draft".into()));
        };
        let drafted = &round.tokens;
        if info.drafted != drafted.len()
            || info.accepted > info.drafted
            || info.accepted_tokens != &drafted[..info.accepted.min(drafted.len())]
        {
            let why = format!(
                "commit of {} accepted of {} drafted does not match the draft {drafted:?}",
                info.accepted, info.drafted
            );
            return Err(self.poison(why));
        }
        let excess = info.drafted.saturating_sub(info.accepted + 1);
        match round.before {
            Some(before) if excess > 0 && !self.caches.can_trim_after(0, excess) => {
                // Back to the round's start, then the same forwards the
                // draft ran for what is kept: the feed, then each accepted
                // draft alone.
                self.caches = before;
                self.model
                    .forward(&ids(&round.feed), &mut self.caches, &[])?;
                for t in &drafted[..info.accepted] {
                    self.model.forward(&ids(&[*t]), &mut self.caches, &[])?;
                }
            }
            _ if excess > 0 => self.caches.trim(excess)?,
            _ => {}
        }
        // The next draft never rolls back past what this round kept.
        self.caches.commit_to(self.caches.offset());
        Ok(())
    }
}
