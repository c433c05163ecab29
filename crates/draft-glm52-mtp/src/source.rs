//! The per-request source of `glm52-native-mtp`: the draft chain, commit
//! (trim + absorb), rollback on failure, and the MTP cache's persistence.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::head::{commit_tokens, committed_rows, draft_chain};
use spec_core::{CommitInfo, Draft, DraftRequest, DraftSource, PrefillMode, Sampler, SpecError};
use spec_models::glm::{Model, MtpCache, MtpRoundSelection};

fn protocol(message: impl Into<String>) -> SpecError {
    SpecError::Protocol(message.into())
}

/// Drafts with the MTP row over its own latent cache (and its indexer's
/// key cache when the row has an indexer).
#[derive(Debug)]
pub struct Glm52MtpSource<'a> {
    model: &'a Model,
    cache: MtpCache,
    /// Cache offset when the current round began.
    round_start: usize,
    /// Tokens drafted this round, until its commit.
    outstanding: Option<usize>,
    prefilled: bool,
    closed: bool,
}

impl<'a> Glm52MtpSource<'a> {
    /// A source with an empty MTP cache.
    pub fn new(model: &'a Model) -> Self {
        Self {
            model,
            cache: model.new_mtp_cache(),
            round_start: 0,
            outstanding: None,
            prefilled: false,
            closed: false,
        }
    }

    /// Rows in the MTP cache.
    pub fn cache_offset(&self) -> usize {
        self.cache.offset()
    }

    /// Bytes the MTP cache holds.
    pub fn cache_bytes(&self) -> usize {
        self.cache.nbytes()
    }

    /// The MTP cache's `(latent, rope)` rows (`None` while empty).
    pub fn cache_contents(&self) -> Option<(Array, Array)> {
        self.cache.contents()
    }

    /// The MTP indexer's cached keys (`None` while empty or without an
    /// indexer).
    pub fn indexer_keys(&self) -> Option<Array> {
        self.cache.indexer_keys()
    }

    /// Releases the MTP cache; every later call is an error.
    pub fn close(&mut self) {
        self.closed = true;
        self.cache = self.model.new_mtp_cache();
    }

    /// A snapshot of the MTP cache, between rounds only.
    pub fn clone_cache(&self) -> Result<MtpCache, SpecError> {
        self.check_open()?;
        if let Some(d) = self.outstanding {
            return Err(protocol(format!(
                "cannot snapshot the MTP cache during an uncommitted round ({d} drafted)"
            )));
        }
        if self.cache.offset() == 0 {
            return Err(protocol("cannot snapshot an empty MTP cache"));
        }
        Ok(self.cache.clone())
    }

    /// Adopts a snapshot into a source that has not drafted yet, after
    /// checking that it is a non-empty single-row MTP cache of this model.
    pub fn restore_cache(&mut self, cache: MtpCache) -> Result<(), SpecError> {
        self.check_open()?;
        if self.outstanding.is_some() {
            return Err(protocol(
                "cannot restore the MTP cache during a draft round",
            ));
        }
        if self.cache.offset() != 0 {
            return Err(protocol(format!(
                "restore needs an empty source (this one holds {} rows)",
                self.cache.offset()
            )));
        }
        if cache.has_indexer() != self.cache.has_indexer() {
            return Err(protocol(format!(
                "restored MTP cache {} an indexer cache, this model's MTP row {} an indexer",
                if cache.has_indexer() { "has" } else { "lacks" },
                if self.cache.has_indexer() {
                    "has"
                } else {
                    "lacks"
                },
            )));
        }
        let ours = self.cache.geometry();
        if cache.geometry() != ours {
            return Err(protocol(format!(
                "restored cache geometry {:?} does not match the model's {ours:?}",
                cache.geometry()
            )));
        }
        let limit = self.model.config().context_length;
        let Some((latent, _)) = cache.contents() else {
            return Err(protocol("restored MTP cache is empty"));
        };
        if latent.shape()[0] != 1 || cache.offset() > limit {
            return Err(protocol(format!(
                "restored MTP cache must hold one row of at most {limit} positions, got {:?}",
                latent.shape()
            )));
        }
        self.round_start = cache.offset();
        self.cache = cache;
        Ok(())
    }

    fn check_open(&self) -> Result<(), SpecError> {
        if self.closed {
            return Err(protocol("the native MTP source is closed"));
        }
        Ok(())
    }

    /// Drops every row appended since the round began.
    fn roll_back(&mut self) {
        let appended = self.cache.offset().saturating_sub(self.round_start);
        if appended > 0 {
            if let Err(e) = self.cache.trim(appended) {
                tracing::warn!(error = %e, "native MTP rollback failed");
            }
        }
    }

    fn chain(
        &mut self,
        first: u32,
        anchor: &Array,
        n: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        // The first step's picks, reused by the later steps of the round
        // under `index_share_for_mtp_iteration`.
        let mut round: Option<MtpRoundSelection> = None;
        let (model, cache) = (self.model, &mut self.cache);
        draft_chain(first, anchor.clone(), n, sampler, |token, hidden| {
            let out = model.mtp_draft_step(
                &Array::from_slice(&[token], &[1, 1]),
                hidden,
                cache,
                &mut round,
            )?;
            let logits = model.mtp_logits(&out)?.index((.., -1, ..));
            Ok((mlx_ext::softmax::log_softmax(&logits)?, out))
        })
    }

    fn settle(&mut self, drafted: usize, info: &CommitInfo<'_>) -> Result<(), SpecError> {
        let tokens = commit_tokens(info, drafted)?;
        // Only the first row was conditioned on a true target hidden state.
        if drafted > 1 {
            self.cache.trim(drafted - 1)?;
        }
        // The accepted drafts, then the host's tokens accepted after them,
        // each paired with the target hidden that predicted it: the rows a
        // round that had drafted them all would add.
        let n = tokens.len();
        if n > 0 {
            let verified = info.verified_hidden;
            let h = self.model.config().hidden;
            let shape = verified.shape();
            if shape.len() != 3 || shape[0] != 1 || (shape[1] as usize) < n || shape[2] != h {
                return Err(spec_core::InputError::shape(
                    "the verified hidden states",
                    format!("[1, >= {n}, {h}]"),
                    shape,
                )
                .into());
            }
            let pairs = verified.index((.., ..n as i32, ..));
            let out = self.model.mtp_forward(
                &Array::from_slice(&tokens, &[1, n as i32]),
                &pairs,
                &mut self.cache,
            )?;
            out.eval()?;
        }
        let expected = committed_rows(self.round_start, drafted, n);
        if self.cache.offset() != expected {
            return Err(protocol(format!(
                "MTP cache committed to {} rows, expected {expected}",
                self.cache.offset()
            )));
        }
        Ok(())
    }
}

impl DraftSource for Glm52MtpSource<'_> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::Full
    }

    /// Foreign tokens extend the MTP cache as accepted drafts do: a row per
    /// token with the target hidden that predicted it.
    fn takes_foreign_tokens(&self) -> bool {
        true
    }

    /// The MTP cache stays empty (Colibri's "no prefill"): the first draft
    /// starts from the target's anchor hidden and the pending token.
    fn prefill(&mut self, _prompt: &[u32], _taps: Option<&Array>) -> Result<(), SpecError> {
        self.check_open()?;
        if self.prefilled || self.cache.offset() != 0 {
            return Err(protocol("native MTP source prefilled twice"));
        }
        self.prefilled = true;
        Ok(())
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        self.check_open()?;
        if let Some(d) = self.outstanding {
            return Err(protocol(format!(
                "draft called before the previous round ({d} drafted) was committed"
            )));
        }
        let anchor = request
            .anchor_hidden
            .ok_or_else(|| protocol("native MTP drafting needs the target's anchor hidden"))?;
        let h = self.model.config().hidden;
        if anchor.shape() != [1, 1, h] {
            return Err(spec_core::InputError::shape(
                "the native MTP anchor",
                format!("[1, 1, {h}]"),
                anchor.shape(),
            )
            .into());
        }
        let first = *request
            .feed
            .last()
            .ok_or_else(|| protocol("native MTP drafting needs a non-empty feed"))?;
        self.round_start = self.cache.offset();
        match self.chain(first, anchor, request.max_tokens, sampler) {
            Ok(draft) => {
                self.outstanding = Some(draft.tokens.len());
                Ok(draft)
            }
            Err(e) => {
                self.roll_back();
                Err(e)
            }
        }
    }

    fn commit(&mut self, info: CommitInfo<'_>) -> Result<(), SpecError> {
        self.check_open()?;
        let drafted = self
            .outstanding
            .take()
            .ok_or_else(|| protocol("commit without a draft"))?;
        let result = self.settle(drafted, &info);
        if result.is_err() {
            self.roll_back();
        }
        result
    }
}
