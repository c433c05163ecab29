//! The context of a drafter that reads the target's tapped hidden states
//! (DSpark, DFlash): per draft layer, the keys and values projected from
//! those taps, one row per target position, plus the form a prefix cache
//! saves it in.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use spec_core::SavedDraft;

use crate::ModelError;

/// Keys and values of the projected context, one pair per draft layer,
/// `[1, kv_heads, T, head_dim]`. A clone shares the (immutable) arrays.
#[derive(Debug, Default, Clone)]
pub struct TapContext {
    layers: Vec<(Array, Array)>,
    len: usize,
}

impl TapContext {
    /// Context rows held (the position of the next anchor).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Draft layer `i`'s keys and values, when any row is held.
    pub fn layer(&self, i: usize) -> Option<&(Array, Array)> {
        self.layers.get(i)
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| k.nbytes() + v.nbytes())
            .sum()
    }

    /// The first `rows` rows (every row is projected from its own taps at
    /// its own position, so they are the rows a context of only those
    /// tokens holds); `None` past the rows held.
    pub fn truncated(&self, rows: usize) -> Option<TapContext> {
        if rows > self.len {
            return None;
        }
        let r = rows as i32;
        Some(TapContext {
            layers: self
                .layers
                .iter()
                .map(|(k, v)| (k.index((.., .., ..r, ..)), v.index((.., .., ..r, ..))))
                .collect(),
            len: rows,
        })
    }

    /// Appends `rows` fresh rows, one `(keys, values)` pair per layer, and
    /// evaluates the result. Everything is computed before anything is
    /// stored: on error the context is as it was.
    pub fn append(&mut self, fresh: Vec<(Array, Array)>, rows: usize) -> Result<(), ModelError> {
        if rows == 0 {
            return Ok(());
        }
        let merged: Vec<(Array, Array)> = if self.layers.is_empty() {
            fresh
        } else {
            self.layers
                .iter()
                .zip(fresh)
                .map(|((k0, v0), (k1, v1))| {
                    Ok((concatenate(&[k0, &k1], 2)?, concatenate(&[v0, &v1], 2)?))
                })
                .collect::<Result<_, ModelError>>()?
        };
        mlx_rs::transforms::eval(merged.iter().flat_map(|(k, v)| [k, v]))?;
        self.layers = merged;
        self.len += rows;
        Ok(())
    }
}

/// A context as a prefix cache keeps it: the rows right after a prefill.
#[derive(Debug)]
pub struct SavedTapContext(pub TapContext);

impl SavedDraft for SavedTapContext {
    fn tokens(&self) -> usize {
        self.0.len()
    }
    fn nbytes(&self) -> usize {
        self.0.nbytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Rows of `[1, L, ..]` taps (0 for none); `None` when they are not 3-d.
pub fn tap_rows(taps: Option<&Array>) -> Option<usize> {
    match taps {
        Some(t) if t.ndim() == 3 => Some(t.shape()[1] as usize),
        Some(_) => None,
        None => Some(0),
    }
}
