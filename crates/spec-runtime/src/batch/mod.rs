//! Packed ragged batches: several requests' windows laid one after another
//! on the sequence axis of one `[1, T, hidden]` forward. Work done token by
//! token (embeddings, norms, projections, MLPs) runs once over the packed
//! tokens, streaming the weights once for every row; what mixes positions
//! (RoPE at a row's offset, its cache update, its attention) runs per row on
//! that row's slice. A single-request forward is the one-row case: its
//! window is the whole sequence axis and nothing is sliced.

use std::ops::Range;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use spec_core::{BatchOutput, BatchRow, CacheSet, InputError, LayerCache, RowForm, SpecError};

use crate::ModelError;

/// One request's window inside a packed forward.
#[derive(Debug)]
pub struct Row<'a> {
    /// The request's caches.
    pub caches: &'a mut CacheSet,
    /// Prefill chunk or decoding rows.
    pub form: RowForm,
}

impl Row<'_> {
    /// The cache in `slot` of this row's set.
    pub fn cache(&mut self, slot: usize) -> Result<&mut (dyn LayerCache + 'static), ModelError> {
        let len = self.caches.len();
        self.caches
            .get_mut(slot)
            .ok_or_else(|| SpecError::from(InputError::CacheSlot { slot, len }).into())
    }
}

/// The token ids of every row, packed, and where each row lies.
#[derive(Debug)]
pub struct Packed<'a> {
    /// `[B, T]` int32 or uint32 ids (`B` is 1 for a batch of several rows).
    pub ids: Array,
    /// The rows, in order.
    pub rows: Vec<Row<'a>>,
    /// Each row's window on the sequence axis.
    pub spans: Vec<Range<usize>>,
    /// Grouped attention's masks built so far in this forward, by the
    /// positions they depend on (layers of one kind share one).
    pub masks: Vec<(attention::MaskKey, Array)>,
    /// Which rows attend together, planned at the first layer.
    pub plan: Option<attention::Plan>,
}

impl<'a> Packed<'a> {
    /// One request's `[B, L]` window (a `forward` or `decode` call).
    pub fn single(
        tokens: &Array,
        caches: &'a mut CacheSet,
        form: RowForm,
    ) -> Result<Self, SpecError> {
        if tokens.ndim() != 2 {
            return Err(InputError::shape("tokens", "[B, L]", tokens.shape()).into());
        }
        let l = usize::try_from(tokens.shape()[1]).unwrap_or(0);
        if l == 0 {
            return Err(InputError::NoTokens { what: "a forward" }.into());
        }
        let ids = if tokens.dtype() == Dtype::Uint32 || tokens.dtype() == Dtype::Int32 {
            tokens.clone()
        } else {
            tokens.as_dtype(Dtype::Int32)?
        };
        Ok(Self {
            ids,
            rows: vec![Row { caches, form }],
            spans: std::iter::once(0..l).collect(),
            masks: Vec::new(),
            plan: None,
        })
    }

    /// The rows of a batched forward, packed into `[1, T]`.
    pub fn batch(rows: &'a mut [BatchRow<'_>]) -> Result<Self, SpecError> {
        if rows.is_empty() {
            return Err(InputError::EmptyBatch.into());
        }
        if let Some(i) = rows.iter().position(|r| r.tokens.is_empty()) {
            return Err(InputError::EmptyRow { row: i }.into());
        }
        let mut tokens = Vec::new();
        let mut spans = Vec::with_capacity(rows.len());
        for row in rows.iter() {
            spans.push(tokens.len()..tokens.len() + row.tokens.len());
            tokens.extend_from_slice(row.tokens);
        }
        let total = i32::try_from(tokens.len()).map_err(|_| {
            SpecError::from(InputError::TooLarge {
                what: "batch token count",
                value: tokens.len(),
            })
        })?;
        Ok(Self {
            ids: Array::from_slice(&tokens, &[1, total]),
            rows: rows
                .iter_mut()
                .map(|r| Row {
                    caches: &mut *r.caches,
                    form: r.form,
                })
                .collect(),
            spans,
            masks: Vec::new(),
            plan: None,
        })
    }

    /// Decoding rows of one token each, their ids `[1, n]` as an array
    /// (lazy: nothing is read back), row `i`'s caches `caches[i]`.
    pub fn lazy(ids: &Array, caches: &'a mut [&mut CacheSet]) -> Result<Self, SpecError> {
        let n = caches.len();
        if n == 0 {
            return Err(InputError::EmptyBatch.into());
        }
        if ids.shape() != [1, n as i32] {
            return Err(InputError::shape(
                "the ids of decoding rows",
                format!("[1, {n}] (one per row)"),
                ids.shape(),
            )
            .into());
        }
        let ids = if ids.dtype() == Dtype::Uint32 || ids.dtype() == Dtype::Int32 {
            ids.clone()
        } else {
            ids.as_dtype(Dtype::Int32)?
        };
        Ok(Self {
            ids,
            rows: caches
                .iter_mut()
                .map(|c| Row {
                    caches: c,
                    form: RowForm::Decode,
                })
                .collect(),
            spans: (0..n).map(|i| i..i + 1).collect(),
            masks: Vec::new(),
            plan: None,
        })
    }

    /// Checks every row's cache count against `caches` (a model of
    /// `layers` decoder layers whose caches are laid out as `layout` says)
    /// and the tap indices against `tap_limit`, before any cache is touched.
    pub fn check(
        &self,
        caches: usize,
        layers: usize,
        layout: &'static str,
        taps: &[usize],
        tap_limit: usize,
    ) -> Result<(), SpecError> {
        for (i, row) in self.rows.iter().enumerate() {
            if row.caches.len() != caches {
                return Err(InputError::CacheCount {
                    row: (self.rows.len() > 1).then_some(i),
                    layers,
                    expected: caches,
                    got: row.caches.len(),
                    layout,
                }
                .into());
            }
        }
        if let Some(&index) = taps.iter().find(|&&t| t >= tap_limit) {
            return Err(InputError::TapOutOfRange {
                index,
                layers: tap_limit,
            }
            .into());
        }
        Ok(())
    }

    /// Row `r`'s slice of a packed `[B, T, ..]` array (the array itself for
    /// a single row).
    pub fn slice(&self, x: &Array, r: usize) -> Result<Array, SpecError> {
        slice(&self.spans, x, r)
    }

    /// Rows' `[B, L, ..]` results packed back on the sequence axis.
    pub fn join(parts: Vec<Array>) -> Result<Array, SpecError> {
        match <[Array; 1]>::try_from(parts) {
            Ok([one]) => Ok(one),
            Err(parts) => Ok(mlx_rs::ops::concatenate(&parts, 1)?),
        }
    }

    /// The batched output.
    pub fn into_batch_output(self, hidden: Array, taps: Option<Array>) -> BatchOutput {
        BatchOutput {
            hidden,
            taps,
            spans: self.spans,
        }
    }
}

/// A model whose forward runs over packed rows (every architecture here):
/// its `forward_batch` and `decode_rows` are [`forward_batch`] and
/// [`decode_rows`].
pub trait PackedForward {
    /// Hidden states `[1, T, hidden]` and taps over `packed`'s rows.
    fn run_packed(
        &self,
        packed: &mut Packed<'_>,
        taps: &[usize],
    ) -> Result<(Array, Option<Array>), SpecError>;
}

/// `Target::forward_batch`: one packed forward over `rows`.
pub fn forward_batch(
    model: &impl PackedForward,
    rows: &mut [BatchRow<'_>],
    taps: &[usize],
) -> Result<BatchOutput, SpecError> {
    let mut packed = Packed::batch(rows)?;
    let (hidden, taps) = model.run_packed(&mut packed, taps)?;
    Ok(packed.into_batch_output(hidden, taps))
}

/// `Target::decode_rows`: the packed forward over lazy ids.
pub fn decode_rows(
    model: &impl PackedForward,
    ids: &Array,
    caches: &mut [&mut CacheSet],
) -> Result<BatchOutput, SpecError> {
    let mut packed = Packed::lazy(ids, caches)?;
    let (hidden, taps) = model.run_packed(&mut packed, &[])?;
    Ok(packed.into_batch_output(hidden, taps))
}

/// Row `r`'s slice, on the sequence axis, of an array packed by `spans`
/// (the array itself for a single row).
pub fn slice(spans: &[Range<usize>], x: &Array, r: usize) -> Result<Array, SpecError> {
    let s = spans.get(r).ok_or(InputError::MissingRow {
        what: "slice of the batch",
        row: r,
        rows: spans.len(),
    })?;
    if spans.len() == 1 {
        return Ok(x.clone());
    }
    Ok(x.index((.., s.start as i32..s.end as i32)))
}

/// `f` over `inputs` (each `[B, T, ..]`, packed by `spans`) by groups of
/// rows: the rows for which `together` holds in one call over their packed
/// tokens, every other row alone (`f` gets its index); the results back in
/// row order. For per-token work whose form depends on how many tokens it
/// sees (an expert block that regroups tokens by expert past a size): a row
/// computed alone keeps its own form.
pub fn grouped(
    spans: &[Range<usize>],
    inputs: &[&Array],
    together: impl Fn(usize) -> bool,
    f: impl Fn(&[Array], Option<usize>) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    let n = spans.len();
    let shared: Vec<usize> = (0..n).filter(|&r| together(r)).collect();
    if shared.len() == n {
        let all: Vec<Array> = inputs.iter().map(|&a| a.clone()).collect();
        return f(&all, None);
    }
    let rows_of = |rows: &[usize]| -> Result<Vec<Array>, SpecError> {
        inputs
            .iter()
            .map(|&a| {
                Packed::join(
                    rows.iter()
                        .map(|&r| slice(spans, a, r))
                        .collect::<Result<_, _>>()?,
                )
            })
            .collect()
    };
    let mut parts: Vec<Option<Array>> = vec![None; n];
    if !shared.is_empty() {
        let y = f(&rows_of(&shared)?, None)?;
        let mut at = 0;
        for &r in &shared {
            let len = spans[r].len() as i32;
            parts[r] = Some(y.index((.., at..at + len)));
            at += len;
        }
    }
    for (r, part) in parts.iter_mut().enumerate() {
        if part.is_none() {
            *part = Some(f(&rows_of(&[r])?, Some(r))?);
        }
    }
    Ok(Packed::join(parts.into_iter().flatten().collect())?)
}

pub mod attention;
