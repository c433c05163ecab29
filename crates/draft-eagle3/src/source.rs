//! The per-request source of `eagle3`: the head's key/value cache, whose
//! row `j` pairs token `j + 1` with the projected target features at `j`
//! (or, while drafting, the head's own previous output), and the anchor:
//! the projected features at the position that predicted the pending
//! token. Prefill fills the prompt's rows from the taps; a round drafts a
//! chain; a commit drops the speculative rows and absorbs the accepted
//! tokens with the verified window's taps.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::head::{commit_tokens, committed_rows, draft_chain};
use spec_core::{
    CommitInfo, Draft, DraftRequest, DraftSource, InputError, LayerCache, PrefillMode, Sampler,
    SavedDraft, SpecError, Target,
};

use spec_runtime::cache::SavedHeadRows;

use crate::model::{Eagle3Model, HeadCache};

fn protocol(message: impl Into<String>) -> SpecError {
    SpecError::Protocol(message.into())
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}

/// Chain-drafts with an EAGLE-3 head.
#[derive(Debug)]
pub struct Eagle3Source<'a> {
    model: std::rc::Rc<Eagle3Model>,
    target: &'a dyn Target,
    /// Target layers tapped: the outputs of the layers before the fused
    /// inputs, low to high.
    taps: Vec<usize>,
    cache: HeadCache,
    /// The projected features that predicted the pending token `[1, 1, H]`.
    anchor: Option<Array>,
    round_start: usize,
    outstanding: Option<usize>,
    /// The last draft's logits over the draft vocabulary, `[n, draft_vocab]`.
    last_logits: Option<Array>,
    /// The prompt's projected features `[1, P, H]`, kept from the prefill
    /// until the first draft (what a prefix-cache entry saves).
    prompt_features: Option<Array>,
}

impl<'a> Eagle3Source<'a> {
    pub(crate) fn new(
        model: std::rc::Rc<Eagle3Model>,
        target: &'a dyn Target,
        taps: Vec<usize>,
    ) -> Self {
        Self {
            model,
            target,
            taps,
            cache: HeadCache::new(),
            anchor: None,
            round_start: 0,
            outstanding: None,
            last_logits: None,
            prompt_features: None,
        }
    }

    /// Rows in the head's cache.
    pub fn cache_offset(&self) -> usize {
        self.cache.offset()
    }

    /// The head cache's valid `(keys, values)` rows (`None` while empty).
    pub fn cache_contents(&self) -> Option<(Array, Array)> {
        let (arrays, len) = self.cache.raw();
        let [keys, values] = arrays?;
        let rows = |a: &Array| a.index((.., .., ..len as i32, ..));
        Some((rows(keys), rows(values)))
    }

    /// The last draft's logits over the head's draft vocabulary, one row
    /// per drafted token (`None` before any draft).
    pub fn last_draft_logits(&self) -> Option<&Array> {
        self.last_logits.as_ref()
    }

    fn width(&self) -> i32 {
        3 * self.model.config().target_hidden
    }

    /// Checks `features` is `[1, >= rows, 3 * target_hidden]`.
    fn check_features(
        &self,
        what: &'static str,
        features: &Array,
        rows: usize,
    ) -> Result<(), SpecError> {
        let shape = features.shape();
        let w = self.width();
        if shape.len() != 3 || shape[0] != 1 || (shape[1] as usize) < rows || shape[2] != w {
            return Err(InputError::shape(what, format!("[1, >= {rows}, {w}]"), shape).into());
        }
        Ok(())
    }

    /// The layer over `tokens` paired with projected `hidden` rows.
    fn extend(&mut self, tokens: &[u32], hidden: &Array) -> Result<Array, SpecError> {
        let embedded = self.model.embed(&ids(tokens), self.target)?;
        Ok(self.model.layer(&embedded, hidden, &mut self.cache)?)
    }

    /// Adds the rows of prompt positions `from..len-1` (token `j + 1` with
    /// the projected features at `j`; `projected` holds every prompt
    /// position's) and sets the anchor.
    fn absorb_prompt(
        &mut self,
        prompt: &[u32],
        from: usize,
        projected: Array,
    ) -> Result<(), SpecError> {
        let rows = prompt.len();
        if rows > from + 1 {
            let hidden = projected.index((.., from as i32..rows as i32 - 1, ..));
            let out = self.extend(&prompt[from + 1..], &hidden)?;
            out.eval()?;
        }
        let anchor = crate::model::last(&projected);
        anchor.eval()?;
        self.anchor = Some(anchor);
        self.prompt_features = Some(projected);
        self.round_start = self.cache.offset();
        Ok(())
    }

    fn roll_back(&mut self) {
        let appended = self.cache.offset().saturating_sub(self.round_start);
        if appended > 0 {
            if let Err(e) = self.cache.trim(appended) {
                tracing::warn!(error = %e, "eagle3 rollback failed");
            }
        }
    }

    fn chain(
        &mut self,
        first: u32,
        anchor: Array,
        n: usize,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let mut rows = Vec::with_capacity(n);
        let (model, target, cache) = (&self.model, self.target, &mut self.cache);
        let draft = draft_chain(first, anchor, n, sampler, |token, hidden| {
            let embedded = model.embed(&ids(&[token]), target)?;
            let out = model.layer(&embedded, hidden, cache)?;
            let draft_logits = model.draft_logits(&out)?.index((.., -1, ..));
            let logits = model.target_logits(&draft_logits)?;
            rows.push(draft_logits);
            Ok((mlx_ext::softmax::log_softmax(&logits)?, out))
        })?;
        self.last_logits = if rows.is_empty() {
            None
        } else {
            Some(concatenate(&rows, 0)?)
        };
        Ok(draft)
    }

    fn settle(&mut self, drafted: usize, info: &CommitInfo<'_>) -> Result<Array, SpecError> {
        let tokens = commit_tokens(info, drafted)?;
        let taps = info
            .verified_taps
            .ok_or_else(|| protocol("an eagle3 commit needs the verified window's taps"))?;
        let n = tokens.len();
        // The features at the window's positions 0..=n: n absorbed, the
        // last the next anchor.
        self.check_features("the verified window's taps", taps, n + 1)?;
        if drafted > 1 {
            self.cache.trim(drafted - 1)?;
        }
        let projected = self.model.project(&taps.index((.., ..=n as i32, ..)))?;
        if n > 0 {
            let out = self.extend(&tokens, &projected.index((.., ..n as i32, ..)))?;
            out.eval()?;
        }
        let expected = committed_rows(self.round_start, drafted, n);
        if self.cache.offset() != expected {
            return Err(protocol(format!(
                "eagle3 cache committed to {} rows, expected {expected}",
                self.cache.offset()
            )));
        }
        Ok(projected.index((.., n as i32..=n as i32, ..)))
    }
}

impl DraftSource for Eagle3Source<'_> {
    fn prefill_mode(&self) -> PrefillMode {
        PrefillMode::Full
    }

    /// Foreign tokens extend the head's cache as accepted drafts do, each
    /// with the verified features that predicted it.
    fn takes_foreign_tokens(&self) -> bool {
        true
    }

    fn tap_layers(&self) -> &[usize] {
        &self.taps
    }

    /// The prompt's rows (token `j + 1` with the features at `j`) and the
    /// anchor (the features at the last prompt position).
    fn prefill(&mut self, prompt: &[u32], taps: Option<&Array>) -> Result<(), SpecError> {
        if self.anchor.is_some() || self.cache.offset() != 0 {
            return Err(protocol("eagle3 source prefilled twice"));
        }
        let taps = taps.ok_or_else(|| protocol("eagle3 prefill needs the target's taps"))?;
        let rows = prompt.len();
        self.check_features("the eagle3 prefill's taps", taps, rows)?;
        if taps.shape()[1] as usize != rows {
            return Err(InputError::shape(
                "the eagle3 prefill's taps",
                format!("[1, {rows}, {}], one row per prompt token", self.width()),
                taps.shape(),
            )
            .into());
        }
        let projected = self.model.project(taps)?;
        self.absorb_prompt(prompt, 0, projected)
    }

    fn save_prefill(&self) -> Option<Box<dyn SavedDraft>> {
        let features = self.prompt_features.clone()?;
        if self.outstanding.is_some() {
            return None;
        }
        Some(Box::new(SavedHeadRows::new(self.cache.clone(), features)))
    }

    /// Keeps the saved rows of the first `keep` prompt tokens (their cache
    /// rows and projected features) and adds the rest from `taps`, which
    /// cover `prompt[keep..]` (the host prefilled the target from `keep`).
    fn prefill_from(
        &mut self,
        saved: &dyn SavedDraft,
        keep: usize,
        prompt: &[u32],
        taps: Option<&Array>,
    ) -> Result<bool, SpecError> {
        if self.anchor.is_some() || self.cache.offset() != 0 {
            return Err(protocol("eagle3 source prefilled twice"));
        }
        let Some(saved) = saved.as_any().downcast_ref::<SavedHeadRows>() else {
            return Ok(false);
        };
        let Some((cache, kept)) = saved.restore(keep, prompt.len())? else {
            return Ok(false);
        };
        let fresh = prompt.len() - keep;
        let projected = match taps {
            Some(t) if fresh > 0 => {
                self.check_features("the eagle3 prefill's taps", t, fresh)?;
                if t.shape()[1] as usize != fresh {
                    return Err(InputError::shape(
                        "the eagle3 prefill's taps after the saved rows",
                        format!("[1, {fresh}, {}]", self.width()),
                        t.shape(),
                    )
                    .into());
                }
                concatenate(&[kept, self.model.project(t)?], 1)?
            }
            None if fresh == 0 => kept,
            _ => {
                return Err(protocol(
                    "eagle3 prefill from saved rows: taps do not match",
                ))
            }
        };
        self.cache = cache;
        self.absorb_prompt(prompt, keep - 1, projected)?;
        Ok(true)
    }

    fn draft(
        &mut self,
        request: DraftRequest<'_>,
        sampler: &mut dyn Sampler,
    ) -> Result<Draft, SpecError> {
        let anchor = self
            .anchor
            .clone()
            .ok_or_else(|| protocol("eagle3 draft before prefill"))?;
        if let Some(d) = self.outstanding {
            return Err(protocol(format!(
                "draft called before the previous round ({d} drafted) was committed"
            )));
        }
        let first = *request
            .feed
            .last()
            .ok_or_else(|| protocol("eagle3 drafting needs a non-empty feed"))?;
        self.round_start = self.cache.offset();
        self.prompt_features = None;
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
        match self.settle(drafted, &info) {
            Ok(anchor) => {
                self.anchor = Some(anchor);
                Ok(())
            }
            Err(e) => {
                self.roll_back();
                Err(e)
            }
        }
    }
}
