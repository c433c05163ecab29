//! The per-request source of `qwen3-native-mtp`: prefill from the target's
//! last-layer taps, the draft chain, commit (trim + absorb), rollback on
//! failure.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::head::{commit_tokens, committed_rows, draft_chain};
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, InputError, LayerCache, PrefillMode, Sampler,
    SavedDraft, SpecError, Target,
};
use spec_models::qwen3_next::{Model, MtpCache};
use spec_runtime::cache::SavedHeadRows;

fn protocol(message: impl Into<String>) -> SpecError {
    SpecError::Protocol(message.into())
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Drafts with the MTP head over its own key/value cache.
#[derive(Debug)]
pub struct Qwen3MtpSource<'a> {
    model: &'a Model,
    cache: MtpCache,
    /// The target layer whose output the prefill reads: the last.
    taps: [usize; 1],
    /// Cache offset when the current round began.
    round_start: usize,
    /// Tokens drafted this round, until its commit.
    outstanding: Option<usize>,
    prefilled: bool,
    /// The prompt's post-norm hidden states `[1, P, H]`, kept from the
    /// prefill until the first draft (what a prefix-cache entry saves).
    prompt_hidden: Option<Array>,
}

impl<'a> Qwen3MtpSource<'a> {
    /// A source with an empty MTP cache.
    pub fn new(model: &'a Model) -> Self {
        Self {
            model,
            cache: model.new_mtp_cache(),
            taps: [model.config().mixers.len().saturating_sub(1)],
            round_start: 0,
            outstanding: None,
            prefilled: false,
            prompt_hidden: None,
        }
    }

    /// Rows in the MTP cache.
    pub fn cache_offset(&self) -> usize {
        self.cache.offset()
    }

    /// The MTP cache's valid `(keys, values)` rows (`None` while empty).
    pub fn cache_contents(&self) -> Option<(Array, Array)> {
        let (arrays, len) = self.cache.raw();
        let [keys, values] = arrays?;
        let rows = |a: &Array| a.index((.., .., ..len as i32, ..));
        Some((rows(keys), rows(values)))
    }

    /// Adds the rows of prompt positions `from..len-1` (token `j + 1` with
    /// the hidden state at `j`; `hidden` holds every prompt position's).
    fn absorb_prompt(
        &mut self,
        prompt: &[u32],
        from: usize,
        hidden: Array,
    ) -> Result<(), SpecError> {
        let rows = prompt.len();
        if rows > from + 1 {
            let pairs = hidden.index((.., from as i32..rows as i32 - 1, ..));
            let out = self
                .model
                .mtp_forward(&ids(&prompt[from + 1..]), &pairs, &mut self.cache)?;
            out.eval()?;
        }
        self.prompt_hidden = Some(hidden);
        self.round_start = self.cache.offset();
        self.prefilled = true;
        Ok(())
    }

    /// Drops every row appended since the round began.
    fn roll_back(&mut self) {
        let appended = self.cache.offset().saturating_sub(self.round_start);
        if appended > 0 {
            if let Err(e) = self.cache.trim(appended) {
                tracing::warn!(error = %e, "qwen3 MTP rollback failed");
            }
        }
    }

    fn hidden_size(&self) -> i32 {
        self.model.config().hidden
    }

    fn chain(
        &mut self,
        first: u32,
        anchor: &Array,
        n: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let (model, cache) = (self.model, &mut self.cache);
        draft_chain(first, anchor.clone(), n, sampler, |token, hidden| {
            let out = model.mtp_forward(&ids(&[token]), hidden, cache)?;
            let logits = model.logits(&out)?.index((.., -1, ..));
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
        // each paired with the target hidden that predicted it.
        let n = tokens.len();
        if n > 0 {
            let verified = info.verified_hidden;
            let h = self.hidden_size();
            let shape = verified.shape();
            if shape.len() != 3 || shape[0] != 1 || (shape[1] as usize) < n || shape[2] != h {
                return Err(InputError::shape(
                    "the verified hidden states",
                    format!("[1, >= {n}, {h}]"),
                    shape,
                )
                .into());
            }
            let pairs = verified.index((.., ..n as i32, ..));
            let out = self
                .model
                .mtp_forward(&ids(&tokens), &pairs, &mut self.cache)?;
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

impl DraftSource for Qwen3MtpSource<'_> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::Full
    }

    /// Foreign tokens extend the MTP cache as accepted drafts do: a row per
    /// token with the target hidden that predicted it.
    fn takes_foreign_tokens(&self) -> bool {
        true
    }

    fn tap_layers(&self) -> &[usize] {
        &self.taps
    }

    /// The prompt's rows: token `j + 1` with the post-norm hidden state at
    /// `j`, for every `j` before the last prompt position (whose hidden
    /// state anchors the first draft).
    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        if self.prefilled || self.cache.offset() != 0 {
            return Err(protocol("qwen3 MTP source prefilled twice"));
        }
        let h = self.hidden_size();
        let taps = taps.ok_or_else(|| protocol("qwen3 MTP prefill needs the last layer's taps"))?;
        let rows = prompt.len() as i32;
        if taps.shape() != [1, rows, h] {
            return Err(InputError::shape(
                "the qwen3 MTP prefill's last-layer taps",
                format!("[1, {rows}, {h}], one row per prompt token"),
                taps.shape(),
            )
            .into());
        }
        let hidden = self.model.final_norm(taps)?;
        self.absorb_prompt(prompt, 0, hidden)
    }

    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        let hidden = self.prompt_hidden.clone()?;
        if self.outstanding.is_some() {
            return None;
        }
        Some(Box::new(SavedHeadRows::new(self.cache.clone(), hidden)))
    }

    /// Keeps the saved rows of the first `keep` prompt tokens (their cache
    /// rows and hidden states) and adds the rest from `taps`, which cover
    /// `prompt[keep..]` (the host prefilled the target from `keep`).
    /// Declined where an expert MTP layer computes the saved prompt's or
    /// this prompt's rows in mlx-lm's sorted form (their bits depend on the
    /// chunk, so a split prefill could differ from a cold one).
    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
    ) -> Result<bool, SpecError> {
        if self.prefilled || self.cache.offset() != 0 {
            return Err(protocol("qwen3 MTP source prefilled twice"));
        }
        let Some(saved) = saved.as_any().downcast_ref::<SavedHeadRows>() else {
            return Ok(false);
        };
        let rows = |tokens: usize| tokens.saturating_sub(1);
        if self.model.mtp_sorts(rows(saved.tokens())) || self.model.mtp_sorts(rows(prompt.len())) {
            return Ok(false);
        }
        let Some((cache, kept)) = saved.restore(keep, prompt.len())? else {
            return Ok(false);
        };
        let fresh = prompt.len() - keep;
        let h = self.hidden_size();
        let hidden = match taps {
            Some(t) if fresh > 0 && t.shape() == [1, fresh as i32, h] => {
                concatenate(&[kept, self.model.final_norm(t)?], 1)?
            }
            None if fresh == 0 => kept,
            _ => {
                return Err(InputError::shape(
                    "the qwen3 MTP prefill's taps after the saved rows",
                    format!("[1, {fresh}, {h}]"),
                    taps.map(Array::shape).unwrap_or(&[]),
                )
                .into())
            }
        };
        self.cache = cache;
        self.absorb_prompt(prompt, keep - 1, hidden)?;
        Ok(true)
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        if !self.prefilled {
            return Err(protocol("qwen3 MTP draft before prefill"));
        }
        if let Some(d) = self.outstanding {
            return Err(protocol(format!(
                "draft called before the previous round ({d} drafted) was committed"
            )));
        }
        let anchor = request
            .anchor_hidden
            .ok_or_else(|| protocol("qwen3 MTP drafting needs the target's anchor hidden"))?;
        let h = self.hidden_size();
        if anchor.shape() != [1, 1, h] {
            return Err(InputError::shape(
                "the qwen3 MTP anchor",
                format!("[1, 1, {h}]"),
                anchor.shape(),
            )
            .into());
        }
        let first = *request
            .feed
            .last()
            .ok_or_else(|| protocol("qwen3 MTP drafting needs a non-empty feed"))?;
        self.round_start = self.cache.offset();
        self.prompt_hidden = None;
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
