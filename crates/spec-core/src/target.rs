//! The view of a target model that the serve loop and draft providers use.

use mlx_rs::Array;

use crate::{CacheSet, InputError, SpecError};

/// Facts about a loaded target model.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetInfo {
    /// `model_type` of the checkpoint (`llama`, `qwen3`, ...).
    pub model_type: String,
    /// Rows of the embedding table / columns of the logits.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Longest context the checkpoint was trained for, when it says.
    pub context_length: Option<usize>,
}

/// What one forward pass returns.
#[derive(Debug)]
pub struct TargetOutput {
    /// Hidden states after the final norm, `[1, L, hidden]`.
    pub hidden: Array,
    /// The outputs of the requested layers concatenated on the last axis,
    /// `[1, L, taps * hidden]`, when taps were asked for.
    pub taps: Option<Array>,
}

/// How a row of a batched forward is computed: the same two forms a
/// single-request forward has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowForm {
    /// A prompt chunk, computed as [`Target::forward`] computes it.
    Prefill,
    /// Decoding rows (a pending token and its drafts), computed as
    /// [`Target::decode`] computes them.
    Decode,
}

/// One request's window in a batched forward.
#[derive(Debug)]
pub struct BatchRow<'a> {
    /// The window's tokens (at least one).
    pub tokens: &'a [u32],
    /// The request's own caches, appended to by the forward.
    pub caches: &'a mut CacheSet,
    /// Prefill chunk or decoding rows.
    pub form: RowForm,
}

/// What a batched forward returns: the rows' windows packed one after the
/// other on the sequence axis.
#[derive(Debug)]
pub struct BatchOutput {
    /// Post-norm hidden states `[1, T, hidden]`, `T` the sum of the windows.
    pub hidden: Array,
    /// The requested layers' outputs `[1, T, taps * hidden]`, when asked.
    pub taps: Option<Array>,
    /// Where each row's window lies on the sequence axis, in row order.
    pub spans: Vec<std::ops::Range<usize>>,
}

impl BatchOutput {
    /// Row `i`'s hidden states `[1, L, hidden]`.
    pub fn row_hidden(&self, i: usize) -> Option<Array> {
        use mlx_rs::ops::indexing::IndexOp;
        let s = self.spans.get(i)?;
        Some(self.hidden.index((.., s.start as i32..s.end as i32, ..)))
    }

    /// Row `i`'s tapped outputs `[1, L, taps * hidden]`, when taps were asked.
    pub fn row_taps(&self, i: usize) -> Option<Array> {
        use mlx_rs::ops::indexing::IndexOp;
        let s = self.spans.get(i)?;
        self.taps
            .as_ref()
            .map(|t| t.index((.., s.start as i32..s.end as i32, ..)))
    }
}

/// A target model: forward over a window of tokens with per-request caches.
pub trait Target: std::fmt::Debug {
    /// Facts about the model.
    fn info(&self) -> &TargetInfo;
    /// Fresh caches for one request.
    fn make_caches(&self) -> CacheSet;
    /// Runs `tokens` (`[1, L]`, int32 or uint32) through the model, appending to
    /// `caches`; `taps` lists decoder-layer indices whose outputs to return.
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError>;
    /// `forward` over decoding rows (a pending token and its drafts, or one
    /// token of plain decoding) rather than a prompt chunk. Every row must
    /// give the bits it gives when run alone: architectures whose multi-row
    /// forward computes rows another way than a single-row one (GLM's MLA
    /// expands the latent cache for several queries and absorbs it for one)
    /// override this to compute each row as a single query.
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.forward(tokens, caches, taps)
    }
    /// One forward over several requests' windows (a ragged batch: each row
    /// its own length, form and cache offset). Every row must give exactly
    /// the bits it gives through `forward` / `decode` alone: products over
    /// the packed rows are row-invariant, and whatever mixes positions
    /// (attention) sees only the row's own cache and positions, per row or,
    /// where that is proven bit-exact, for a group of rows of one short
    /// window length at once (the llama family: RoPE with an offset per
    /// row, each row's keys zero-padded to the group's longest, a mask
    /// hiding the padding; off where the probe finds it inexact, as on
    /// macOS). `taps` applies to every row. On error the caches may have
    /// advanced; the caller rolls each row back.
    ///
    /// The default runs the rows one after another (correct, with no
    /// sharing of the weights' traffic); architectures override it to run
    /// one packed forward.
    fn forward_batch(
        &self,
        rows: &mut [BatchRow<'_>],
        taps: &[usize],
    ) -> Result<BatchOutput, SpecError> {
        let mut hidden = Vec::with_capacity(rows.len());
        let mut tapped = Vec::with_capacity(rows.len());
        let mut spans = Vec::with_capacity(rows.len());
        let mut at = 0;
        for row in rows.iter_mut() {
            let ids = Array::from_slice(row.tokens, &[1, row.tokens.len() as i32]);
            let out = match row.form {
                RowForm::Prefill => self.forward(&ids, row.caches, taps)?,
                RowForm::Decode => self.decode(&ids, row.caches, taps)?,
            };
            spans.push(at..at + row.tokens.len());
            at += row.tokens.len();
            hidden.push(out.hidden);
            if let Some(t) = out.taps {
                tapped.push(t);
            }
        }
        let hidden = mlx_rs::ops::concatenate(&hidden, 1)?;
        let taps = if tapped.is_empty() {
            None
        } else {
            Some(mlx_rs::ops::concatenate(&tapped, 1)?)
        };
        Ok(BatchOutput {
            hidden,
            taps,
            spans,
        })
    }
    /// One decoding step of several rows, one token each, whose ids are
    /// still lazy (`ids`: `[1, n]` uint32, row `i`'s token in column `i`,
    /// say the previous step's sampling): exactly `forward_batch` over
    /// those rows ([`RowForm::Decode`], no taps), `caches[i]` row `i`'s.
    /// Architectures that pack ids as an array take them as they are, so a
    /// host can queue step `k + 1` before step `k`'s tokens are read back
    /// (pipelined decoding); the default reads the ids back and runs
    /// `forward_batch`.
    fn decode_rows(
        &self,
        ids: &Array,
        caches: &mut [&mut CacheSet],
    ) -> Result<BatchOutput, SpecError> {
        let ids = ids.as_dtype(mlx_rs::Dtype::Uint32)?;
        ids.eval()?;
        let tokens = ids.as_slice::<u32>().to_vec();
        if ids.shape() != [1, caches.len() as i32] {
            return Err(InputError::shape(
                "decode_rows' ids",
                format!("[1, {}] (one per row)", caches.len()),
                ids.shape(),
            )
            .into());
        }
        let mut rows: Vec<BatchRow<'_>> = tokens
            .iter()
            .zip(caches.iter_mut())
            .map(|(t, c)| BatchRow {
                tokens: std::slice::from_ref(t),
                caches: c,
                form: RowForm::Decode,
            })
            .collect();
        self.forward_batch(&mut rows, &[])
    }
    /// Logits `[.., vocab]` from post-norm hidden states.
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError>;
    /// [`Target::logits`] before the model's final logit softcap, for
    /// drafters that apply a scale and softcap of their own to the target's
    /// head (DFlash); the same as `logits` for a model without one.
    fn logits_before_softcap(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.logits(hidden)
    }
    /// Token embeddings, as the model's first layer sees them.
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError>;
    /// Bytes of weights held.
    fn weights_bytes(&self) -> usize;
    /// The concrete model, for providers that need more than this view (a
    /// native MTP head reads the target's own MTP weights).
    fn as_any(&self) -> &dyn std::any::Any;
    /// Whether prefill and decoding are split-invariant: after any split of
    /// a token sequence into prompt chunks ([`RowForm::Prefill`]) and
    /// decoding windows ([`RowForm::Decode`]), alone or in a batch, the
    /// caches hold, and every row's hidden state is, the bits one prefill
    /// of the same tokens gives. A host may then reuse caches at any token
    /// boundary (a prefix cache that keeps generated tokens too). `false`
    /// by default: claim it only where a test proves it (GLM's prefill is
    /// not: its chunk form differs from its single-query form).
    fn split_invariant(&self) -> bool {
        false
    }
}

/// A boxed target is a target (hosts hold `Box<dyn Target>` from a loader).
impl<T: Target + ?Sized> Target for Box<T> {
    fn info(&self) -> &TargetInfo {
        (**self).info()
    }
    fn make_caches(&self) -> CacheSet {
        (**self).make_caches()
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        (**self).forward(tokens, caches, taps)
    }
    fn decode(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        (**self).decode(tokens, caches, taps)
    }
    fn forward_batch(
        &self,
        rows: &mut [BatchRow<'_>],
        taps: &[usize],
    ) -> Result<BatchOutput, SpecError> {
        (**self).forward_batch(rows, taps)
    }
    fn decode_rows(
        &self,
        ids: &Array,
        caches: &mut [&mut CacheSet],
    ) -> Result<BatchOutput, SpecError> {
        (**self).decode_rows(ids, caches)
    }
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        (**self).logits(hidden)
    }
    fn logits_before_softcap(&self, hidden: &Array) -> Result<Array, SpecError> {
        (**self).logits_before_softcap(hidden)
    }
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        (**self).embed(tokens)
    }
    fn weights_bytes(&self) -> usize {
        (**self).weights_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        (**self).as_any()
    }
    fn split_invariant(&self) -> bool {
        (**self).split_invariant()
    }
}
