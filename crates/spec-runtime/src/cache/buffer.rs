//! `Rows`, the buffer under every cache: `N` tensors `[B, heads, T, D]` kept
//! in lockstep along the time axis, grown in steps and written at a cursor.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;
use spec_core::SpecError;

/// Positions a buffer grows by when it runs out of room (mlx-lm's step).
pub const STEP: usize = 256;

/// Positions on the time axis (axis 2) of `a`.
pub fn rows_of(a: &Array) -> usize {
    a.shape().get(2).copied().unwrap_or(0).max(0) as usize
}

/// Rows `from..to` of `a` along the time axis.
pub fn slice(a: &Array, from: usize, to: usize) -> Array {
    a.index((.., .., from as i32..to as i32, ..))
}

/// `f` applied to each of the `N` arrays.
pub fn try_map<const N: usize>(
    arrays: &[Array; N],
    f: impl FnMut(&Array) -> Result<Array, SpecError>,
) -> Result<[Array; N], SpecError> {
    let mapped = arrays.iter().map(f).collect::<Result<Vec<_>, _>>()?;
    into_array(mapped)
}

/// `new` appended to `old`, array by array, along the time axis.
pub fn concat_rows<const N: usize>(
    old: &[Array; N],
    new: [&Array; N],
) -> Result<[Array; N], SpecError> {
    let joined = old
        .iter()
        .zip(new)
        .map(|(o, n)| concatenate(&[o.clone(), n.clone()], 2))
        .collect::<Result<Vec<_>, _>>()?;
    into_array(joined)
}

fn into_array<const N: usize>(arrays: Vec<Array>) -> Result<[Array; N], SpecError> {
    arrays
        .try_into()
        .map_err(|_| SpecError::Internal("cache buffer lost an array"))
}

/// The storage of one cache: `N` arrays `[B, heads, capacity, D]` (keys and
/// values, or keys alone) and a cursor `len`. Rows `..len` are the valid ones;
/// rows past it are room to write into or rolled-back rows that the next
/// write overwrites. `append` writes at the cursor with `slice_update`,
/// growing the capacity in steps of [`STEP`] zero rows (never past `limit`),
/// as mlx-lm's `KVCache` does; `trim` moves the cursor back exactly. A clone
/// is a snapshot: MLX arrays are immutable and a write replaces them.
#[derive(Debug, Clone)]
pub struct Rows<const N: usize> {
    arrays: Option<[Array; N]>,
    len: usize,
    limit: usize,
}

impl<const N: usize> Default for Rows<N> {
    fn default() -> Self {
        Self::with_limit(usize::MAX)
    }
}

impl<const N: usize> Rows<N> {
    /// An empty buffer whose growth stops at `limit` rows.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            arrays: None,
            len: 0,
            limit,
        }
    }

    /// A buffer over `arrays` (every array `[B, heads, capacity, D]`, or
    /// none) whose first `len` rows are valid (a cache read from a file).
    pub fn from_parts(arrays: Option<[Array; N]>, len: usize) -> Self {
        Self {
            arrays,
            len,
            limit: usize::MAX,
        }
    }

    /// The cursor: valid rows, and where the next `append` writes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no row is valid.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows allocated (0 before the first write).
    pub fn capacity(&self) -> usize {
        self.arrays.as_ref().map_or(0, |a| rows_of(&a[0]))
    }

    /// The whole storage, valid rows or not; `None` before the first write.
    pub fn arrays(&self) -> Option<&[Array; N]> {
        self.arrays.as_ref()
    }

    /// Rows `..len`, the whole storage when it is full; `None` before the
    /// first write.
    pub fn valid(&self) -> Option<[Array; N]> {
        let arrays = self.arrays.as_ref()?;
        Some(if self.len < self.capacity() {
            arrays.each_ref().map(|a| slice(a, 0, self.len))
        } else {
            arrays.clone()
        })
    }

    /// Writes `rows` (each `[B, heads, L, D]`, one per array) at the cursor,
    /// growing first if they do not fit, and moves the cursor past them.
    /// Returns the valid rows.
    pub fn append(&mut self, rows: [&Array; N]) -> Result<[Array; N], SpecError> {
        let l = rows_of(rows[0]);
        if rows.iter().any(|r| r.ndim() != 4 || rows_of(r) != l) {
            return Err(spec_core::InputError::Shape {
                what: "cache rows",
                expected: "[B, heads, L, D] with one L".into(),
                got: rows.iter().map(|r| r.shape().to_vec()).collect(),
            }
            .into());
        }
        let (at, end) = (self.len, self.len + l);
        if end > self.capacity() {
            self.grow(rows, end)?;
        }
        let Some(arrays) = self.arrays.as_mut() else {
            return Err(SpecError::Internal("cache buffer missing after growth"));
        };
        for (array, new) in arrays.iter_mut().zip(rows) {
            array.try_index_mut((.., .., at as i32..end as i32, ..), new)?;
        }
        self.len = end;
        self.valid()
            .ok_or(SpecError::Internal("cache buffer missing after a write"))
    }

    /// Appends zero rows, whole steps of them, until `end` rows fit; rows
    /// past the cursor are dropped first unless the cursor sits on a step
    /// (mlx-lm's `KVCache` does both the same way).
    fn grow(&mut self, like: [&Array; N], end: usize) -> Result<(), SpecError> {
        let at = self.len;
        let kept = match &self.arrays {
            Some(_) if !at.is_multiple_of(STEP) => at.min(self.capacity()),
            _ => self.capacity(),
        };
        let wanted = (end - at).div_ceil(STEP) * STEP;
        let added = wanted.min(self.limit.saturating_sub(kept));
        if kept + added < end {
            return Err(spec_core::InputError::CacheFull {
                limit: self.limit,
                rows: end,
            }
            .into());
        }
        let mut grown = Vec::with_capacity(N);
        for (i, r) in like.into_iter().enumerate() {
            let s = r.shape();
            let zeros = zeros_dtype(&[s[0], s[1], added as i32, s[3]], r.dtype())?;
            grown.push(match self.arrays.as_ref().map(|a| &a[i]) {
                None => zeros,
                Some(old) if kept < rows_of(old) => concatenate(&[slice(old, 0, kept), zeros], 2)?,
                Some(old) => concatenate(&[old.clone(), zeros], 2)?,
            });
        }
        self.arrays = Some(into_array(grown)?);
        Ok(())
    }

    /// Moves the cursor back `n` rows; an error (and no change) past the
    /// first row.
    pub fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if n > self.len {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!("only {} tokens cached", self.len),
            });
        }
        self.len -= n;
        Ok(())
    }

    /// Replaces the storage by `arrays`, every row valid (layouts that
    /// concatenate or cut their rows).
    pub fn set(&mut self, arrays: [Array; N]) {
        self.len = rows_of(&arrays[0]);
        self.arrays = Some(arrays);
    }

    /// Moves the cursor to `at` (a ring wrapping, a layout re-basing).
    pub fn seek(&mut self, at: usize) {
        self.len = at;
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.arrays
            .as_ref()
            .map_or(0, |a| a.iter().map(Array::nbytes).sum())
    }
}
