//! Attention masks shared by the models and drafters, built with their
//! references' op sequences (boolean: `true` where a query may see a key;
//! additive: `0` or `-1e9`).

use mlx_rs::ops::{arange, select, zeros};
use mlx_rs::Array;
use spec_core::SpecError;

use crate::ModelError;

/// A position as MLX's `i32`, an error when it does not fit.
fn as_i32(v: usize) -> Result<i32, ModelError> {
    i32::try_from(v).map_err(|_| {
        ModelError::Spec(SpecError::from(spec_core::InputError::TooLarge {
            what: "position",
            value: v,
        }))
    })
}

/// mlx-lm's causal mask `[L, offset + L]` for `l` queries after `offset`
/// cached positions (`None` for a single query, which sees every key).
pub fn causal_mask(l: usize, offset: usize) -> Result<Option<Array>, ModelError> {
    if l == 1 {
        return Ok(None);
    }
    let end = as_i32(offset + l)?;
    let rinds = arange::<_, i32>(0, end, None)?;
    let linds = arange::<_, i32>(as_i32(offset)?, end, None)?.reshape(&[-1, 1])?;
    Ok(Some(linds.ge(rinds.reshape(&[1, -1])?)?))
}

/// Which earlier keys a layer's queries see: the last `size` positions, of
/// which the first `sinks` of the sequence stay for good (`--max-kv-size`:
/// mlx-lm's `keep`; 0 on a sliding layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Positions seen, the query's own included.
    pub size: usize,
    /// First positions of the sequence every query sees.
    pub sinks: usize,
}

impl Window {
    /// A sliding window of `size` positions.
    pub fn sliding(size: usize) -> Self {
        Self { size, sinks: 0 }
    }
}

/// Boolean mask `[L, K]`: query at `q0 + i` sees key at `k0 + j` when it is
/// not in the future and less than `window` positions back.
pub fn window_mask(
    q0: usize,
    l: usize,
    k0: usize,
    k: usize,
    window: usize,
) -> Result<Array, ModelError> {
    sink_window_mask(q0, l, k0, k, Window::sliding(window))
}

/// Boolean mask `[L, K]` over keys whose first `min(sinks, K)` are the
/// positions `0..` and whose key `j` past them is at `k0 + j`: query at
/// `q0 + i` sees a key not in the future that is a sink or less than
/// `size - sinks` positions back.
pub fn sink_window_mask(
    q0: usize,
    l: usize,
    k0: usize,
    k: usize,
    window: Window,
) -> Result<Array, ModelError> {
    let q = arange::<_, i32>(as_i32(q0)?, as_i32(q0 + l)?, None)?.reshape(&[-1, 1])?;
    let j = arange::<_, i32>(0, as_i32(k)?, None)?.reshape(&[1, -1])?;
    let kp = key_positions(&j, &Array::from_int(as_i32(k0)?), window.sinks.min(k), None)?;
    sees(&q, &kp, Some(window))
}

/// The positions of fetched keys `j` (broadcast index arrays): `base + j`,
/// but `j` itself for the first `sinks` (those of a window that keeps the
/// first positions, `j < fetched` where some rows are padding).
pub fn key_positions(
    j: &Array,
    base: &Array,
    sinks: usize,
    fetched: Option<&Array>,
) -> Result<Array, ModelError> {
    let kp = j.add(base)?;
    if sinks == 0 {
        return Ok(kp);
    }
    let mut sink = j.lt(Array::from_int(as_i32(sinks)?))?;
    if let Some(fetched) = fetched {
        sink = sink.logical_and(&j.lt(fetched)?)?;
    }
    Ok(select(&sink, j, &kp)?)
}

/// Whether a query at `q` sees a key at `kp` (broadcast position arrays):
/// not in the future and, in a window, one of its sinks or less than
/// `size - sinks` positions back.
pub fn sees(q: &Array, kp: &Array, window: Option<Window>) -> Result<Array, ModelError> {
    let causal = q.ge(kp)?;
    let Some(window) = window else {
        return Ok(causal);
    };
    let back = as_i32(window.size.saturating_sub(window.sinks))?;
    let mut seen = q.lt(kp.add(Array::from_int(back))?)?;
    if window.sinks > 0 {
        seen = seen.logical_or(&kp.lt(Array::from_int(as_i32(window.sinks)?))?)?;
    }
    Ok(causal.logical_and(&seen)?)
}

/// The window mask of `l` queries after `offset` over the `fetched` keys a
/// layer's cache handed out (the last of them the queries' own), where
/// `window` bounds the layer and the keys need one: `None` where the plain
/// causal rule (several queries) or no mask (one query) sees the right keys.
pub fn bounded_mask(
    window: Option<Window>,
    offset: usize,
    l: usize,
    fetched: usize,
) -> Result<Option<Array>, ModelError> {
    match window {
        Some(window) if l > 1 || fetched > window.size => Ok(Some(sink_window_mask(
            offset,
            l,
            (offset + l).saturating_sub(fetched),
            fetched,
            window,
        )?)),
        _ => Ok(None),
    }
}

/// Additive mask `[1, 1, 1, rows]` hiding the first `hidden` of `rows` keys
/// (`-1e9`) from every query: optiq's sliding window over a drafter's donor
/// rows.
pub fn hide_first_keys(rows: i32, hidden: i32) -> Result<Array, ModelError> {
    let index = arange::<_, i32>(0, rows, 1)?;
    let masked = index.lt(Array::from_int(hidden))?;
    Ok(select(
        &masked,
        Array::from_f32(-1e9),
        zeros::<f32>(&[1, 1, 1, rows])?,
    )?)
}
