//! Attention over packed rows by groups: rows whose windows have the same
//! short length `L` (decoding steps, verify windows) run RoPE and attention
//! as one `[B, heads, L, D]` batch; every other row runs alone. Each row
//! still appends to and reads its own cache; the group's keys and values are
//! zero-padded on the right to the longest row's and a mask hides the
//! padding.
//!
//! Why a grouped row keeps the bits it has alone (checked at first use by
//! [`exact`] and by the batch tests): RoPE with an offset array is MLX's
//! element-wise sequence of the integer form; `Q K^T` goes through our GEMM
//! front, whose every output element is one reduction over `D` (more keys
//! are more independent outputs); MLX's CPU softmax on Linux is scalar, so a
//! masked key (the minimum float, `exp` of which is 0) adds exact zeros
//! after the real keys; `P V` reduces each output over the keys in order,
//! and a zero probability times a zero value adds nothing. Where one of
//! these fails (macOS: 8-wide softmax and Metal's fused kernel) the probe
//! fails and every row runs alone.

use std::ops::Range;
use std::sync::OnceLock;

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{arange, concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};
use spec_core::SpecError;

use super::Packed;
use crate::rope::Rope;
use crate::ModelError;

/// The longest window that groups: verify windows and decoding steps. Longer
/// rows (prefill chunks) run alone, where their per-row ops are amortized
/// and padding them would cost real work.
pub(crate) const MAX_GROUPED_WINDOW: usize = 16;

/// The positions a group's mask depends on, one entry per row: the first
/// query's position, the first fetched key's position and the fetched key
/// count; the window length and the sliding window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MaskKey {
    queries: Vec<i32>,
    keys: Vec<i32>,
    fetched: Vec<i32>,
    l: i32,
    window: Option<usize>,
}

/// The groups of `spans`' rows that attend together: at least two rows of
/// the same length (at most [`MAX_GROUPED_WINDOW`]), rows in order; empty
/// where grouping would not be exact for `dtype` ([`exact`]).
pub(crate) fn groups(spans: &[Range<usize>], dtype: Dtype) -> Vec<Vec<usize>> {
    if spans.len() < 2 || !exact(dtype) {
        return Vec::new();
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (r, s) in spans.iter().enumerate() {
        if s.len() > MAX_GROUPED_WINDOW {
            continue;
        }
        match groups.iter_mut().find(|g| spans[g[0]].len() == s.len()) {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    groups.retain(|g| g.len() > 1);
    groups
}

/// Packed attention: the grouped rows together ([`attend_group`]), the
/// others through `alone` (row index, `[1, L, heads * D]`); `queries`,
/// `keys`, `values` are the packed `[1, T, heads, D]` projections before
/// RoPE. Returns `[1, T, heads * D]`, rows in order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    packed: &mut Packed<'_>,
    queries: &Array,
    keys: &Array,
    values: &Array,
    rope: &Rope,
    layer: usize,
    window: Option<usize>,
    scale: f32,
    mut alone: impl FnMut(&mut Packed<'_>, usize) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    let n = packed.rows.len();
    let mut outs: Vec<Option<Array>> = vec![None; n];
    for group in groups(&packed.spans, queries.dtype()) {
        let out = attend_group(
            packed, &group, queries, keys, values, rope, layer, window, scale,
        )?;
        if group.len() == n {
            // Every row, in order: the group's output is the packed one.
            let (b, l) = (out.shape()[0], out.shape()[1]);
            return Ok(out.reshape(&[1, b * l, -1])?);
        }
        for (i, &r) in group.iter().enumerate() {
            let i = i as i32;
            outs[r] = Some(out.index((i..i + 1, .., ..)));
        }
    }
    let mut parts = Vec::with_capacity(n);
    for (r, out) in outs.into_iter().enumerate() {
        parts.push(match out {
            Some(out) => out,
            None => alone(packed, r)?,
        });
    }
    Ok(Packed::join(parts)?)
}

/// One group's attention: `[B, L, heads * D]`, row `i` of the result for
/// `rows[i]`.
#[allow(clippy::too_many_arguments)]
fn attend_group(
    packed: &mut Packed<'_>,
    rows: &[usize],
    queries: &Array,
    keys: &Array,
    values: &Array,
    rope: &Rope,
    layer: usize,
    window: Option<usize>,
    scale: f32,
) -> Result<Array, ModelError> {
    count_group();
    let b = rows.len() as i32;
    let l = packed.spans[rows[0]].len();
    let take = |a: &Array| -> Result<Array, ModelError> {
        let shape = a.shape();
        let every_row = rows.len() == packed.spans.len();
        let a = if every_row {
            a.clone()
        } else {
            let at: Vec<i32> = rows
                .iter()
                .flat_map(|&r| packed.spans[r].clone())
                .map(|t| t as i32)
                .collect();
            let n = at.len() as i32;
            a.take_axis(Array::from_slice(&at, &[n]), 1)?
        };
        Ok(a.reshape(&[b, l as i32, shape[2], shape[3]])?
            .transpose_axes(&[0, 2, 1, 3])?)
    };
    let (q, k, v) = (take(queries)?, take(keys)?, take(values)?);
    let mut offsets = Vec::with_capacity(rows.len());
    for &r in rows {
        offsets.push(as_i32(packed.rows[r].cache(layer)?.offset())?);
    }
    let at = Array::from_slice(&offsets, &[b]);
    let q = rope.apply_rows(&q, &at)?;
    let k = rope.apply_rows(&k, &at)?;
    let mut fetched_keys = Vec::with_capacity(rows.len());
    let mut fetched_values = Vec::with_capacity(rows.len());
    for (i, &r) in rows.iter().enumerate() {
        let i = i as i32;
        let row = |a: &Array| a.index((i..i + 1, .., .., ..));
        let (rk, rv) = packed.rows[r]
            .cache(layer)?
            .update_and_fetch(&row(&k), &row(&v))?;
        fetched_keys.push(rk);
        fetched_values.push(rv);
    }
    let fetched: Vec<i32> = fetched_keys.iter().map(|a| a.shape()[2]).collect();
    let longest = fetched.iter().copied().max().unwrap_or(0);
    let keys = padded(fetched_keys, longest)?;
    let values = padded(fetched_values, longest)?;
    // The last fetched key is the window's last query (caches hand keys in
    // time order), so a row's first fetched key sits `fetched` back.
    let key = MaskKey {
        keys: offsets
            .iter()
            .zip(&fetched)
            .map(|(o, f)| o + l as i32 - f)
            .collect(),
        queries: offsets,
        fetched,
        l: l as i32,
        window,
    };
    let mask = match packed.masks.iter().find(|(k, _)| *k == key) {
        Some((_, m)) => m.clone(),
        None => {
            let m = group_mask(&key, longest)?;
            packed.masks.push((key, m.clone()));
            m
        }
    };
    let out = mlx_rs::fast::scaled_dot_product_attention(
        &q,
        &keys,
        &values,
        scale,
        ScaledDotProductAttentionMask::Array(&mask),
        None,
    )?;
    Ok(out
        .transpose_axes(&[0, 2, 1, 3])?
        .reshape(&[b, l as i32, -1])?)
}

/// Rows' `[1, heads, T_r, D]` arrays as one `[B, heads, longest, D]`, each
/// zero-padded on the right (one concatenation for the whole group).
fn padded(rows: Vec<Array>, longest: i32) -> Result<Array, ModelError> {
    let b = rows.len() as i32;
    let Some(first) = rows.first() else {
        return Err(SpecError::Invalid("an empty attention group".into()).into());
    };
    let (heads, d, dtype) = (first.shape()[1], first.shape()[3], first.dtype());
    let mut parts = Vec::with_capacity(2 * rows.len());
    for a in rows {
        let short = longest - a.shape()[2];
        parts.push(a);
        if short > 0 {
            parts.push(zeros_dtype(&[1, heads, short, d], dtype)?);
        }
    }
    Ok(concatenate(&parts, 2)?
        .reshape(&[heads, b, longest, d])?
        .transpose_axes(&[1, 0, 2, 3])?)
}

/// Boolean `[B, 1, L, longest]`: row `r`'s query `i` (at `queries[r] + i`)
/// sees its key `j` (at `keys[r] + j`) when `j` is a fetched key, not in the
/// future and, on a sliding layer, less than `window` positions back: the
/// mask each row has alone (causal, or `mask::window_mask`), padded.
fn group_mask(key: &MaskKey, longest: i32) -> Result<Array, ModelError> {
    let b = key.queries.len() as i32;
    let column = |v: &[i32]| Array::from_slice(v, &[b, 1, 1, 1]);
    let q = column(&key.queries).add(arange::<_, i32>(0, key.l, None)?.reshape(&[1, 1, -1, 1])?)?;
    let j = arange::<_, i32>(0, longest, None)?.reshape(&[1, 1, 1, -1])?;
    let kp = column(&key.keys).add(&j)?;
    let mut mask = q.ge(&kp)?.logical_and(&j.lt(column(&key.fetched))?)?;
    if let Some(w) = key.window {
        mask = mask.logical_and(&q.lt(kp.add(Array::from_int(as_i32(w)?))?)?)?;
    }
    Ok(mask)
}

fn as_i32(v: usize) -> Result<i32, ModelError> {
    i32::try_from(v)
        .map_err(|_| ModelError::Spec(SpecError::Invalid(format!("position {v} too large"))))
}

/// Whether grouping gives every row of `dtype` its bits alone here: checked
/// once per process and dtype on small random rows (one query and four,
/// grouped-query heads, rows of different lengths), against each row's
/// attention alone as the models run it. Only float32, bfloat16 and
/// float16 are probed (other dtypes run alone), each apart: a machine may
/// vectorize one dtype's softmax and not another's. Off where MLX's softmax
/// is vectorized or its attention fused (macOS), whatever the probe says.
pub(crate) fn exact(dtype: Dtype) -> bool {
    static EXACT: [OnceLock<bool>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match dtype {
        Dtype::Float32 => 0,
        Dtype::Bfloat16 => 1,
        Dtype::Float16 => 2,
        _ => return false,
    };
    *EXACT[slot].get_or_init(|| cfg!(target_os = "linux") && probe(dtype).unwrap_or(false))
}

fn probe(dtype: Dtype) -> Result<bool, ModelError> {
    let key = mlx_rs::random::key(11)?;
    let lengths = [1, 9, 20, 33];
    let (heads, kv, d) = (4, 2, 16);
    {
        for l in [1, 4] {
            let b = lengths.len() as i32;
            let normal = |shape: &[i32]| -> Result<Array, ModelError> {
                Ok(mlx_rs::random::normal::<f32>(shape, None, None, &key)?.as_dtype(dtype)?)
            };
            let q = normal(&[b, heads, l, d])?;
            let rows: Vec<(Array, Array)> = lengths
                .iter()
                .map(|&t| Ok((normal(&[1, kv, t + l, d])?, normal(&[1, kv, t + l, d])?)))
                .collect::<Result<_, ModelError>>()?;
            let longest = lengths.iter().max().copied().unwrap_or(0) + l;
            let keys = padded(rows.iter().map(|r| r.0.clone()).collect(), longest)?;
            let values = padded(rows.iter().map(|r| r.1.clone()).collect(), longest)?;
            let mask = group_mask(
                &MaskKey {
                    queries: lengths.to_vec(),
                    keys: vec![0; lengths.len()],
                    fetched: lengths.iter().map(|t| t + l).collect(),
                    l,
                    window: None,
                },
                longest,
            )?;
            let together = mlx_rs::fast::scaled_dot_product_attention(
                &q,
                &keys,
                &values,
                0.25,
                ScaledDotProductAttentionMask::Array(&mask),
                None,
            )?;
            for (i, (k, v)) in rows.iter().enumerate() {
                let i = i as i32;
                let qi = q.index((i..i + 1, .., .., ..));
                let alone = if l > 1 {
                    mlx_rs::fast::scaled_dot_product_attention(
                        &qi,
                        k,
                        v,
                        0.25,
                        ScaledDotProductAttentionMask::Causal,
                        None,
                    )?
                } else {
                    mlx_rs::fast::scaled_dot_product_attention(&qi, k, v, 0.25, None, None)?
                };
                let row = together.index((i..i + 1, .., .., ..));
                if !bits_equal(&row, &alone)? {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

fn bits_equal(a: &Array, b: &Array) -> Result<bool, ModelError> {
    let a = a.as_dtype(Dtype::Float32)?;
    let b = b.as_dtype(Dtype::Float32)?;
    mlx_rs::transforms::eval([&a, &b])?;
    let bits =
        |x: &Array| -> Vec<u32> { x.as_slice::<f32>().iter().map(|v| v.to_bits()).collect() };
    Ok(bits(&a) == bits(&b))
}

#[cfg(test)]
thread_local! {
    static GROUPS_RUN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Grouped attentions run on this thread (tests: the path was taken).
#[cfg(test)]
pub(crate) fn groups_run() -> usize {
    GROUPS_RUN.with(std::cell::Cell::get)
}

fn count_group() {
    #[cfg(test)]
    GROUPS_RUN.with(|c| c.set(c.get() + 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_is_exact_on_linux() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            assert_eq!(exact(dtype), cfg!(target_os = "linux"), "{dtype:?}");
        }
        assert!(!exact(Dtype::Int32), "only float dtypes are probed");
    }

    #[test]
    fn rows_group_by_window_length_and_long_rows_stay_alone() {
        let spans = |lens: &[usize]| -> Vec<Range<usize>> {
            let mut at = 0;
            lens.iter()
                .map(|l| {
                    at += l;
                    at - l..at
                })
                .collect()
        };
        let f32 = Dtype::Float32;
        if !exact(f32) {
            return;
        }
        assert_eq!(groups(&spans(&[1, 1, 1]), f32), vec![vec![0, 1, 2]]);
        assert_eq!(
            groups(&spans(&[1, 4, 40, 1, 4, 7]), f32),
            vec![vec![0, 3], vec![1, 4]]
        );
        assert!(groups(&spans(&[1]), f32).is_empty());
        assert!(groups(&spans(&[17, 17]), f32).is_empty());
        assert!(groups(&spans(&[1, 1]), Dtype::Int32).is_empty());
    }
}
