//! Attention over packed rows by groups: rows with short windows (decoding
//! steps, verify windows, prompt tails) run RoPE and attention as one
//! `[B, heads, L, D]` batch, each row's window padded on the right to the
//! group's length `L` (a power of two); every other row runs alone. Rows
//! whose caches keep keys and values quantized (`--kv-bits`) group the same
//! way, their packed rows padded with zero words, scales and biases
//! ([`quantized_exact`] checks it; where it fails they run alone). Each row
//! still appends only its real keys to its own cache and reads its own cache;
//! the group's keys and values are zero-padded on the right to the longest
//! row's and a mask hides the padding. A padded query's output is dropped.
//!
//! Why a grouped row keeps the bits it has alone (checked at first use by
//! [`exact`] and by the batch tests): RoPE with an offset array is MLX's
//! element-wise sequence of the integer form; `Q K^T` goes through our GEMM
//! front, whose every output element is one reduction over `D` (more keys
//! and more query rows are more independent outputs); MLX's CPU softmax on
//! Linux is scalar and per query row, so a masked key (the minimum float,
//! `exp` of which is 0) adds exact zeros after the real keys; `P V` reduces
//! each output over the keys in order, and a zero probability times a zero
//! value adds nothing. Where one of these fails (macOS: 8-wide softmax and
//! Metal's fused kernel) the probe fails and every row runs alone.

use std::ops::Range;
use std::sync::OnceLock;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{arange, concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};
use spec_core::SpecError;

use super::Packed;
use crate::cache::{
    pack, quantized_mut, quantized_ref, Fetched, KvQuantization, QuantizedKvCache, Side,
};
use crate::mask::{self, Window};
use crate::rope::Rope;
use crate::sdpa::{self, Mask};
use crate::ModelError;

/// The longest window that groups: verify windows (up to 16 drafts and the
/// pending token), decoding steps, short prompt tails. Longer rows (prefill
/// chunks) run alone, where their per-row ops are amortized and padding
/// them would cost real work.
pub const MAX_GROUPED_WINDOW: usize = 32;

/// Rows that attend together: `rows` in order, each padded to `l` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The rows, in order.
    pub rows: Vec<usize>,
    /// The padded window length.
    pub l: usize,
}

/// How a forward's rows attend, the same in every layer (built once per
/// forward, [`Packed::plan`]): the groups, the packed positions each
/// group's `take` gathers (`None`: the packed tokens are the group as it
/// is), the rows in no group (in order), and where each packed token's
/// output lies among the groups' flattened outputs followed by the lone
/// rows' (`None`: in order).
#[derive(Debug)]
pub struct Plan {
    dtype: Dtype,
    groups: Vec<(Group, Option<Array>)>,
    alone: Vec<usize>,
    gather: Option<Array>,
}

impl Plan {
    fn new(spans: &[Range<usize>], dtype: Dtype) -> Self {
        let groups = groups(spans, dtype);
        let mut grouped = vec![false; spans.len()];
        let mut gather = Vec::new();
        let mut at = vec![0usize; spans.len()];
        let mut base = 0;
        let mut planned = Vec::with_capacity(groups.len());
        for g in groups {
            let whole =
                g.rows.len() == spans.len() && g.rows.iter().all(|&r| spans[r].len() == g.l);
            let take = (!whole).then(|| {
                let idx: Vec<i32> = g
                    .rows
                    .iter()
                    .flat_map(|&r| {
                        let s = spans[r].clone();
                        (0..g.l).map(move |i| (s.start + i.min(s.len() - 1)) as i32)
                    })
                    .collect();
                Array::from_slice(&idx, &[idx.len() as i32])
            });
            for (i, &r) in g.rows.iter().enumerate() {
                grouped[r] = true;
                at[r] = base + i * g.l;
            }
            base += g.rows.len() * g.l;
            planned.push((g, take));
        }
        let alone: Vec<usize> = (0..spans.len()).filter(|&r| !grouped[r]).collect();
        for &r in &alone {
            at[r] = base;
            base += spans[r].len();
        }
        for (r, s) in spans.iter().enumerate() {
            gather.extend((0..s.len()).map(|t| (at[r] + t) as i32));
        }
        let in_order =
            gather.iter().enumerate().all(|(i, &g)| g as usize == i) && base == gather.len();
        Self {
            dtype,
            groups: planned,
            alone,
            gather: (!in_order).then(|| Array::from_slice(&gather, &[gather.len() as i32])),
        }
    }
}

/// The positions a group's mask depends on, one entry per row: the first
/// query's position, the first fetched key's position and the fetched key
/// count; the padded window length and the sliding window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskKey {
    queries: Vec<i32>,
    keys: Vec<i32>,
    fetched: Vec<i32>,
    l: i32,
    window: Option<Window>,
}

/// The group length of a window of `len` tokens: 1 (decoding steps), 4,
/// then powers of two, so padding at most doubles a window past 4 tokens.
fn bucket(len: usize) -> usize {
    len.next_power_of_two().max(if len > 1 { 4 } else { 1 })
}

/// The groups of `spans`' rows that attend together: rows whose windows
/// (at most [`MAX_GROUPED_WINDOW`]) fall in one [`bucket`], at least two,
/// rows in order; empty where grouping would not be exact for `dtype`
/// ([`exact`]).
pub fn groups(spans: &[Range<usize>], dtype: Dtype) -> Vec<Group> {
    if spans.len() < 2 || !exact(dtype) {
        return Vec::new();
    }
    let mut groups: Vec<Group> = Vec::new();
    for (r, s) in spans.iter().enumerate() {
        if s.len() > MAX_GROUPED_WINDOW {
            continue;
        }
        let l = bucket(s.len());
        match groups.iter_mut().find(|g| g.l == l) {
            Some(g) => g.rows.push(r),
            None => groups.push(Group { rows: vec![r], l }),
        }
    }
    groups.retain(|g| g.rows.len() > 1);
    // A group whose rows are all shorter than its bucket pads to its
    // longest row.
    for g in &mut groups {
        g.l = g.rows.iter().map(|&r| spans[r].len()).max().unwrap_or(g.l);
    }
    groups
}

/// One layer's attention inputs over the packed rows: the `[1, T, heads,
/// D]` projections before RoPE, the layer's RoPE, cache slot, sliding
/// window and score scale.
#[allow(missing_debug_implementations)]
pub struct Layer<'x> {
    /// Queries `[1, T, heads, D]`.
    pub queries: &'x Array,
    /// Keys `[1, T, kv_heads, D]`.
    pub keys: &'x Array,
    /// Values `[1, T, kv_heads, D]`.
    pub values: &'x Array,
    /// The layer's RoPE.
    pub rope: &'x Rope,
    /// The layer's cache slot.
    pub layer: usize,
    /// The window, if any (a sliding layer's, or `--max-kv-size`'s).
    pub window: Option<Window>,
    /// The score scale.
    pub scale: f32,
    /// Per-head attention sinks (gpt-oss): its rows attend alone, as
    /// nothing checks the grouped form with them.
    pub sinks: Option<&'x Array>,
}

/// Packed attention: the grouped rows together ([`attend_group`]), the
/// others through `alone` (row index, `[1, L, heads * D]`). Returns
/// `[1, T, heads * D]`, rows in order.
pub fn attend(
    packed: &mut Packed<'_>,
    x: &Layer<'_>,
    mut alone: impl FnMut(&mut Packed<'_>, usize) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    if x.sinks.is_some() || !groupable(packed, x.layer)? {
        // Quantized keys and values where grouping them is not exact (rows
        // on both sides of the quantized start, or the probe failed here):
        // each row alone over its own cache.
        let mut parts = Vec::with_capacity(packed.spans.len());
        for r in 0..packed.spans.len() {
            parts.push(alone(packed, r)?);
        }
        return Ok(Packed::join(parts)?);
    }
    let dtype = x.queries.dtype();
    let plan = match packed.plan.take() {
        Some(p) if p.dtype == dtype => p,
        _ => Plan::new(&packed.spans, dtype),
    };
    let result = attend_planned(packed, &plan, x, &mut alone);
    packed.plan = Some(plan);
    result
}

/// Whether the rows of `layer` may attend in groups: always over float
/// caches; over quantized ones where the probe holds ([`quantized_exact`])
/// and every row's window lies on one side of the quantized start, the same
/// side for all (a group reads float rows or packed ones, not both).
fn groupable(packed: &mut Packed<'_>, layer: usize) -> Result<bool, ModelError> {
    let mut first = None;
    for r in 0..packed.rows.len() {
        let len = packed.spans[r].len();
        let cache = packed.rows[r].cache(layer)?;
        let Some(q) = quantized_ref(&*cache) else {
            return Ok(true);
        };
        let side = q.side(len);
        if side == Side::Straddles || first.is_some_and(|f| f != side) {
            return Ok(false);
        }
        first = Some(side);
    }
    Ok(first.is_none() || quantized_exact())
}

fn attend_planned(
    packed: &mut Packed<'_>,
    plan: &Plan,
    x: &Layer<'_>,
    alone: &mut impl FnMut(&mut Packed<'_>, usize) -> Result<Array, ModelError>,
) -> Result<Array, ModelError> {
    let mut parts = Vec::with_capacity(plan.groups.len() + plan.alone.len());
    for (group, take) in &plan.groups {
        let out = attend_group(packed, group, take.as_ref(), x)?;
        let (b, l) = (out.shape()[0], out.shape()[1]);
        parts.push(out.reshape(&[1, b * l, -1])?);
    }
    for &r in &plan.alone {
        parts.push(alone(packed, r)?);
    }
    let out = Packed::join(parts)?;
    Ok(match &plan.gather {
        Some(at) => out.take_axis(at, 1)?,
        None => out,
    })
}

/// One group's attention: `[B, L, heads * D]`, row `i` of the result for
/// `group.rows[i]` (its first `len` positions real, the rest padding).
fn attend_group(
    packed: &mut Packed<'_>,
    group: &Group,
    take: Option<&Array>,
    x: &Layer<'_>,
) -> Result<Array, ModelError> {
    let (rope, layer, window) = (x.rope, x.layer, x.window);
    count_group();
    let rows = &group.rows;
    let b = rows.len() as i32;
    let l = group.l as i32;
    let gather = |a: &Array| -> Result<Array, ModelError> {
        let shape = a.shape();
        let a = match take {
            Some(at) => a.take_axis(at, 1)?,
            None => a.clone(),
        };
        Ok(a.reshape(&[b, l, shape[2], shape[3]])?
            .transpose_axes(&[0, 2, 1, 3])?)
    };
    let (q, k, v) = (gather(x.queries)?, gather(x.keys)?, gather(x.values)?);
    let mut offsets = Vec::with_capacity(rows.len());
    for &r in rows {
        offsets.push(as_i32(packed.rows[r].cache(layer)?.offset())?);
    }
    let at = Array::from_slice(&offsets, &[b]);
    let q = rope.apply_rows(&q, &at)?;
    let k = rope.apply_rows(&k, &at)?;
    // Each row's keys and values, both float, or the six arrays of a
    // quantized cache (keys' words, scales, biases, then the values').
    let mut fetched_rows: Vec<Vec<Array>> = Vec::with_capacity(rows.len());
    let mut params = None;
    let mut lens = Vec::with_capacity(rows.len());
    for (i, &r) in rows.iter().enumerate() {
        let i = i as i32;
        let len = packed.spans[r].len() as i32;
        let row = |a: &Array| a.index((i..i + 1, .., 0..len, ..));
        let cache = packed.rows[r].cache(layer)?;
        let arrays = match quantized_mut(cache) {
            Some(q) => match q.update_and_fetch_side(&row(&k), &row(&v))? {
                Fetched::Float(rk, rv) => vec![rk, rv],
                Fetched::Packed(six, p) => {
                    params = Some(p);
                    six.to_vec()
                }
            },
            None => {
                let cache = packed.rows[r].cache(layer)?;
                let (rk, rv) = cache.update_and_fetch(&row(&k), &row(&v))?;
                vec![rk, rv]
            }
        };
        fetched_rows.push(arrays);
        lens.push(len);
    }
    let fetched: Vec<i32> = fetched_rows.iter().map(|a| a[0].shape()[2]).collect();
    let longest = fetched.iter().copied().max().unwrap_or(0);
    let width = fetched_rows.first().map_or(0, Vec::len);
    let mut columns = Vec::with_capacity(width);
    for j in 0..width {
        columns.push(padded(
            fetched_rows.iter().map(|a| a[j].clone()).collect(),
            longest,
        )?);
    }
    // The last fetched key is the row's last real query (caches hand keys
    // in time order), so a row's first fetched key sits `fetched` back.
    let key = MaskKey {
        keys: offsets
            .iter()
            .zip(&fetched)
            .zip(&lens)
            .map(|((o, f), len)| o + len - f)
            .collect(),
        queries: offsets,
        fetched,
        l,
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
    let mixed = || SpecError::Internal("a group's rows hold caches of two kinds");
    let out = match (params, columns.as_slice()) {
        (Some(params), six) => {
            let six = <[Array; 6]>::try_from(six.to_vec()).map_err(|_| mixed())?;
            let (keys, values) = pack(six, params)?;
            sdpa::quantized_attention(&q, &keys, &values, x.scale, Mask::Array(&mask))?
        }
        (None, [keys, values]) => sdpa::attention(&q, keys, values, x.scale, Mask::Array(&mask))?,
        _ => return Err(mixed().into()),
    };
    Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
}

/// Rows' `[1, heads, T_r, D]` arrays as one `[B, heads, longest, D]`, each
/// zero-padded on the right (one concatenation for the whole group).
fn padded(rows: Vec<Array>, longest: i32) -> Result<Array, ModelError> {
    let b = rows.len() as i32;
    let Some(first) = rows.first() else {
        return Err(SpecError::from(spec_core::InputError::EmptyBatch).into());
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
/// sees its key `j` (at `keys[r] + j`; the first `sinks` of a window that
/// keeps them at `j`) when `j` is a fetched key, not in the future and, in
/// a window, a sink or less than `size - sinks` positions back: the mask
/// each row has alone (causal, or `mask::sink_window_mask`), padded.
fn group_mask(key: &MaskKey, longest: i32) -> Result<Array, ModelError> {
    let b = key.queries.len() as i32;
    let column = |v: &[i32]| Array::from_slice(v, &[b, 1, 1, 1]);
    let q = column(&key.queries).add(arange::<_, i32>(0, key.l, None)?.reshape(&[1, 1, -1, 1])?)?;
    let j = arange::<_, i32>(0, longest, None)?.reshape(&[1, 1, 1, -1])?;
    let fetched = column(&key.fetched);
    let sinks = key.window.map_or(0, |w| w.sinks);
    let kp = mask::key_positions(&j, &column(&key.keys), sinks, Some(&fetched))?;
    Ok(mask::sees(&q, &kp, key.window)?.logical_and(&j.lt(&fetched)?)?)
}

fn as_i32(v: usize) -> Result<i32, ModelError> {
    i32::try_from(v).map_err(|_| {
        ModelError::Spec(SpecError::from(spec_core::InputError::TooLarge {
            what: "position",
            value: v,
        }))
    })
}

/// Whether grouping gives every row of `dtype` its bits alone here: checked
/// once per process and dtype on small random rows (one query and four,
/// grouped-query heads, rows of different lengths), against each row's
/// attention alone as the models run it. Only float32, bfloat16 and
/// float16 are probed (other dtypes run alone), each apart: a machine may
/// vectorize one dtype's softmax and not another's. Off where MLX's softmax
/// is vectorized or its attention fused (macOS), whatever the probe says.
pub fn exact(dtype: Dtype) -> bool {
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
    // Cached keys before each row's window, and three groups: decoding
    // steps, windows of one length, windows of several lengths padded to
    // the longest (a row's real queries fewer than the group's).
    let cached = [1, 9, 20, 33];
    let (heads, kv, d) = (4, 2, 16);
    for windows in [[1, 1, 1, 1], [4, 4, 4, 4], [1, 3, 4, 2]] {
        let l = windows.iter().copied().max().unwrap_or(1);
        let b = cached.len() as i32;
        let normal = |shape: &[i32]| -> Result<Array, ModelError> {
            Ok(mlx_rs::random::normal::<f32>(shape, None, None, &key)?.as_dtype(dtype)?)
        };
        let q = normal(&[b, heads, l, d])?;
        let rows: Vec<(Array, Array)> = cached
            .iter()
            .zip(windows)
            .map(|(&t, w)| Ok((normal(&[1, kv, t + w, d])?, normal(&[1, kv, t + w, d])?)))
            .collect::<Result<_, ModelError>>()?;
        let fetched: Vec<i32> = cached.iter().zip(windows).map(|(t, w)| t + w).collect();
        let longest = fetched.iter().copied().max().unwrap_or(0);
        let keys = padded(rows.iter().map(|r| r.0.clone()).collect(), longest)?;
        let values = padded(rows.iter().map(|r| r.1.clone()).collect(), longest)?;
        let mask = probe_mask(&cached, fetched, l, longest)?;
        let together = sdpa::attention(&q, &keys, &values, 0.25, Mask::Array(&mask))?;
        let alone =
            |qi: &Array, (k, v): &(Array, Array), mask| sdpa::attention(qi, k, v, 0.25, mask);
        if !rows_match_alone(&q, &together, &rows, windows, alone)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A probe's group mask: rows whose fetched keys start at position 0.
fn probe_mask(
    cached: &[i32],
    fetched: Vec<i32>,
    l: i32,
    longest: i32,
) -> Result<Array, ModelError> {
    group_mask(
        &MaskKey {
            queries: cached.to_vec(),
            keys: vec![0; cached.len()],
            fetched,
            l,
            window: None,
        },
        longest,
    )
}

/// Whether row `i` of `together` (its first `windows[i]` queries) has the
/// bits `alone` gives those queries over the row's own keys (`rows[i]`).
fn rows_match_alone<R>(
    q: &Array,
    together: &Array,
    rows: &[R],
    windows: [i32; 4],
    alone: impl Fn(&Array, &R, Mask<'static>) -> Result<Array, ModelError>,
) -> Result<bool, ModelError> {
    for (i, (row, w)) in rows.iter().zip(windows).enumerate() {
        let i = i as i32;
        let qi = q.index((i..i + 1, .., 0..w, ..));
        let mask = if w > 1 { Mask::Causal } else { Mask::None };
        let want = alone(&qi, row, mask)?;
        let got = together.index((i..i + 1, .., 0..w, ..));
        if !bits_equal(&got, &want)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether grouping rows whose caches keep their keys and values quantized
/// (`--kv-bits`) gives every row its bits alone here: the packed rows padded
/// with zero words, scales and biases (keys that dequantize to 0, masked;
/// values of 0 under a zero probability). Checked once per process, as
/// [`exact`], in 4 bits (groups of 32) on float32 rows.
pub fn quantized_exact() -> bool {
    static EXACT: OnceLock<bool> = OnceLock::new();
    *EXACT.get_or_init(|| cfg!(target_os = "linux") && probe_quantized().unwrap_or(false))
}

fn probe_quantized() -> Result<bool, ModelError> {
    let key = mlx_rs::random::key(13)?;
    let quantization = KvQuantization {
        bits: 4,
        group_size: 32,
        start: 0,
    };
    let cached = [1, 9, 20, 33];
    let (heads, kv, d) = (4, 2, 32);
    for windows in [[1, 1, 1, 1], [1, 3, 4, 2]] {
        let l = windows.iter().copied().max().unwrap_or(1);
        let b = cached.len() as i32;
        let normal = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, &key);
        let q = normal(&[b, heads, l, d])?;
        // Each row's six arrays, as its cache holds them.
        let mut rows = Vec::with_capacity(cached.len());
        for (&t, w) in cached.iter().zip(windows) {
            let (k, v) = (normal(&[1, kv, t + w, d])?, normal(&[1, kv, t + w, d])?);
            match QuantizedKvCache::new(quantization).update_and_fetch_side(&k, &v)? {
                Fetched::Packed(six, _) => rows.push(six),
                Fetched::Float(..) => return Ok(false),
            }
        }
        let fetched: Vec<i32> = cached.iter().zip(windows).map(|(t, w)| t + w).collect();
        let longest = fetched.iter().copied().max().unwrap_or(0);
        let column = |j: usize| padded(rows.iter().map(|r| r[j].clone()).collect(), longest);
        let six: Vec<Array> = (0..6).map(column).collect::<Result<_, _>>()?;
        let six =
            <[Array; 6]>::try_from(six).map_err(|_| SpecError::Internal("six columns expected"))?;
        let (keys, values) = pack(six, quantization.params())?;
        let mask = probe_mask(&cached, fetched, l, longest)?;
        let together = sdpa::quantized_attention(&q, &keys, &values, 0.25, Mask::Array(&mask))?;
        let alone = |qi: &Array, six: &[Array; 6], mask| {
            let (k, v) = pack(six.clone(), quantization.params())?;
            sdpa::quantized_attention(qi, &k, &v, 0.25, mask)
        };
        if !rows_match_alone(&q, &together, &rows, windows, alone)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn bits_equal(a: &Array, b: &Array) -> Result<bool, ModelError> {
    // Flattened: a reshape copies a sliced (non-contiguous) view.
    let a = a.as_dtype(Dtype::Float32)?.reshape(&[-1])?;
    let b = b.as_dtype(Dtype::Float32)?.reshape(&[-1])?;
    mlx_rs::transforms::eval([&a, &b])?;
    let bits =
        |x: &Array| -> Vec<u32> { x.as_slice::<f32>().iter().map(|v| v.to_bits()).collect() };
    Ok(bits(&a) == bits(&b))
}

thread_local! {
    static GROUPS_RUN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Grouped attentions run on this thread (for tests: the path was taken).
pub fn groups_run() -> usize {
    GROUPS_RUN.with(std::cell::Cell::get)
}

fn count_group() {
    GROUPS_RUN.with(|c| c.set(c.get() + 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_grouping_is_exact_on_linux() {
        assert_eq!(quantized_exact(), cfg!(target_os = "linux"));
    }

    #[test]
    fn grouping_is_exact_on_linux() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            assert_eq!(exact(dtype), cfg!(target_os = "linux"), "{dtype:?}");
        }
        assert!(!exact(Dtype::Int32), "only float dtypes are probed");
    }

    #[test]
    fn rows_group_by_padded_window_length_and_long_rows_stay_alone() {
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
        let g = |rows: &[usize], l: usize| Group {
            rows: rows.to_vec(),
            l,
        };
        assert_eq!(groups(&spans(&[1, 1, 1]), f32), vec![g(&[0, 1, 2], 1)]);
        // 1s apart; 2-4 pad to the longest (4); 7 and 5 to 7; 40 alone.
        assert_eq!(
            groups(&spans(&[1, 4, 40, 1, 2, 7, 5, 3]), f32),
            vec![g(&[0, 3], 1), g(&[1, 4, 7], 4), g(&[5, 6], 7)]
        );
        // Verify windows of 9-16 drafts and a pending token group up to 32.
        assert_eq!(groups(&spans(&[17, 12, 17, 33]), f32), vec![g(&[0, 2], 17)]);
        assert!(groups(&spans(&[1]), f32).is_empty());
        assert!(groups(&spans(&[1, 2]), f32).is_empty());
        assert!(groups(&spans(&[33, 33]), f32).is_empty());
        assert!(groups(&spans(&[1, 1]), Dtype::Int32).is_empty());
    }

    #[test]
    fn a_plan_gathers_groups_back_into_packed_order() {
        if !exact(Dtype::Float32) {
            return;
        }
        let spans = vec![0..1, 1..3, 3..43, 43..44, 44..47];
        let plan = Plan::new(&spans, Dtype::Float32);
        // Groups: rows 0 and 3 (length 1), rows 1 and 4 (2 and 3, padded to
        // 3); row 2 alone after them.
        let take: Vec<Vec<i32>> = plan
            .groups
            .iter()
            .map(|(_, t)| t.as_ref().expect("take").as_slice::<i32>().to_vec())
            .collect();
        assert_eq!(take, vec![vec![0, 43], vec![1, 2, 2, 44, 45, 46]]);
        let gather = plan.gather.as_ref().expect("gather");
        let mut expected = vec![0, 2, 3];
        expected.extend(8..48);
        expected.extend([1, 5, 6, 7]);
        assert_eq!(gather.as_slice::<i32>(), expected.as_slice());
        // Every row in one unpadded group: nothing to take or gather.
        let plan = Plan::new(&[0..1, 1..2, 2..3], Dtype::Float32);
        assert!(plan.groups[0].1.is_none() && plan.gather.is_none());
    }
}
