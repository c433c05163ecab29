//! The gated delta recurrence (Gated DeltaNet's state update, as mlx-lm's
//! ops path computes it one position at a time) with the CPU's vector units.
//!
//! For each position and value head, MLX's ops compute, over the float32
//! state `S` (`[value_dim, key_dim]`):
//! `S = S * g`; `m = sum_k(S * k)`; `d = (v - m) * beta`;
//! `S = S + k * d`; `y = sum_k(S * q)`: products rounded one by one, each sum
//! one left-to-right chain from zero (MLX's CPU backend has no float32 SIMD
//! type on x86_64 and Linux aarch64, so its reductions walk a row one float
//! at a time). [`recur`] runs the same operations on each element in the
//! same order, one head at a time over all the positions (the head's state
//! stays in the core's cache instead of five state-sized arrays per position
//! passing through memory), with the state transposed (`[key_dim,
//! value_dim]`) so that each sum's chains run side by side in vector lanes.
//! A probe compares the two once per process; where they differ MLX's ops
//! run (the caller's fallback).
//!
//! States handed back are transposed buffers viewed as `[.., value_dim,
//! key_dim]` (`swap_axes`): MLX reads them as it reads any other state, and a
//! later [`recur`] takes them back without a copy.

use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

/// One sequence batch's inputs: queries and keys `[B, L, key_heads,
/// key_dim]` (each key head serving `value_heads / key_heads` value heads
/// in turn, as `repeat` lays them out), values `[B, L, value_heads,
/// value_dim]`, decays and betas `[B, L, value_heads]`, the state before the
/// first position `[B, value_heads, value_dim, key_dim]`. Any float dtype:
/// MLX's ops promote each to float32 before using it, as this does.
#[derive(Debug, Clone, Copy)]
pub struct DeltaInputs<'a> {
    /// Queries (normalised and scaled).
    pub q: &'a Array,
    /// Keys (normalised).
    pub k: &'a Array,
    /// Values.
    pub v: &'a Array,
    /// Per-head decay `g` of each position.
    pub g: &'a Array,
    /// Per-head `beta` of each position.
    pub beta: &'a Array,
    /// The float32 state before the first position.
    pub state: &'a Array,
}

/// What [`recur`] returns: every position's readout `y` (`[B, L,
/// value_heads, value_dim]`, float32) and the states left by positions
/// `keep_from..L`, in order.
#[derive(Debug)]
pub struct DeltaOutput {
    /// The readouts, float32.
    pub y: Array,
    /// The states the kept positions left, `[B, value_heads, value_dim,
    /// key_dim]` each.
    pub kept: Vec<Array>,
}

/// Dimensions of one call.
#[derive(Debug, Clone, Copy)]
struct Dims {
    batch: usize,
    steps: usize,
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
}

/// The recurrence over every position of `x`, keeping the states of
/// positions `keep_from..L`; `None` where it would not give MLX's bits
/// (the probe failed, or shapes it does not take): run MLX's ops instead.
pub fn recur(x: DeltaInputs<'_>, keep_from: usize) -> Result<Option<DeltaOutput>, Exception> {
    if !matches_mlx() {
        return Ok(None);
    }
    recur_unchecked(x, keep_from)
}

fn recur_unchecked(x: DeltaInputs<'_>, keep_from: usize) -> Result<Option<DeltaOutput>, Exception> {
    let Some(d) = dims(&x).filter(|_| x.state.dtype() == Dtype::Float32) else {
        return Ok(None);
    };
    let f32_rows = |a: &Array| -> Result<Array, Exception> {
        let a = if a.dtype() == Dtype::Float32 {
            a.clone()
        } else {
            a.as_dtype(Dtype::Float32)?
        };
        a.contiguous()
    };
    let (q, k, v) = (f32_rows(x.q)?, f32_rows(x.k)?, f32_rows(x.v)?);
    let (g, beta) = (f32_rows(x.g)?, f32_rows(x.beta)?);
    // The transposed state; no copy where it is one of ours.
    let state = x.state.swap_axes(-1, -2)?.contiguous()?;
    mlx_rs::transforms::eval([&q, &k, &v, &g, &beta, &state])?;
    let (Ok(q), Ok(k), Ok(v), Ok(g), Ok(beta), Ok(state)) = (
        q.try_as_slice::<f32>(),
        k.try_as_slice::<f32>(),
        v.try_as_slice::<f32>(),
        g.try_as_slice::<f32>(),
        beta.try_as_slice::<f32>(),
        state.try_as_slice::<f32>(),
    ) else {
        return Ok(None);
    };
    let keep_from = keep_from.min(d.steps);
    let head = d.key_dim * d.value_dim;
    let per_state = d.batch * d.value_heads * head;
    let mut y = crate::host::take(d.batch * d.steps * d.value_heads * d.value_dim);
    // Filled head by head in layout order, so never zeroed first.
    let mut kept: Vec<Vec<f32>> = (keep_from..d.steps)
        .map(|_| crate::host::take_empty(per_state))
        .collect();
    let inputs = Slices { q, k, v, g, beta };
    let mut work = vec![0.0_f32; head];
    let mut scratch = vec![0.0_f32; d.value_dim];
    for b in 0..d.batch {
        for h in 0..d.value_heads {
            let at = (b * d.value_heads + h) * head;
            work.copy_from_slice(&state[at..at + head]);
            for s in 0..d.steps {
                let out = (((b * d.steps + s) * d.value_heads) + h) * d.value_dim;
                step(
                    &d,
                    &inputs,
                    (b, s, h),
                    &mut work,
                    &mut scratch,
                    &mut y[out..out + d.value_dim],
                );
                if s >= keep_from {
                    kept[s - keep_from].extend_from_slice(&work);
                }
            }
        }
    }
    let (bt, hv) = (d.batch as i32, d.value_heads as i32);
    let (dk, dv) = (d.key_dim as i32, d.value_dim as i32);
    let y = crate::host::hand_over(y, &[bt, d.steps as i32, hv, dv]);
    let kept = kept
        .into_iter()
        .map(|buf| crate::host::hand_over(buf, &[bt, hv, dk, dv]).swap_axes(-1, -2))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(DeltaOutput { y, kept }))
}

/// The inputs as float32 rows.
struct Slices<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

/// One position of one head: `work` is its transposed state.
#[inline]
fn step(
    d: &Dims,
    x: &Slices<'_>,
    (b, s, h): (usize, usize, usize),
    work: &mut [f32],
    scratch: &mut [f32],
    y: &mut [f32],
) {
    let kh = h / (d.value_heads / d.key_heads);
    let key_at = ((b * d.steps + s) * d.key_heads + kh) * d.key_dim;
    let value_at = ((b * d.steps + s) * d.value_heads + h) * d.value_dim;
    let gate_at = (b * d.steps + s) * d.value_heads + h;
    let (q, k) = (
        &x.q[key_at..key_at + d.key_dim],
        &x.k[key_at..key_at + d.key_dim],
    );
    let at = kernel::Position {
        q,
        k,
        v: &x.v[value_at..value_at + d.value_dim],
        g: x.g[gate_at],
        beta: x.beta[gate_at],
    };
    kernel::position(work, &at, scratch, y);
}

/// The dimensions of `x`, or `None` where they do not fit one another.
fn dims(x: &DeltaInputs<'_>) -> Option<Dims> {
    let (q, k, v) = (x.q.shape(), x.k.shape(), x.v.shape());
    let (g, beta, state) = (x.g.shape(), x.beta.shape(), x.state.shape());
    let [batch, steps, key_heads, key_dim] = <[i32; 4]>::try_from(q).ok()?;
    let [_, _, value_heads, value_dim] = <[i32; 4]>::try_from(v).ok()?;
    let fits = k == q
        && v[..2] == q[..2]
        && g == [batch, steps, value_heads]
        && beta == g
        && state == [batch, value_heads, value_dim, key_dim]
        && key_heads > 0
        && value_heads % key_heads == 0
        && [batch, steps, key_dim, value_dim].iter().all(|n| *n > 0);
    fits.then_some(Dims {
        batch: batch as usize,
        steps: steps as usize,
        key_heads: key_heads as usize,
        value_heads: value_heads as usize,
        key_dim: key_dim as usize,
        value_dim: value_dim as usize,
    })
}

/// MLX's ops for the same recurrence (`gated_delta.py`'s ops path, one
/// position at a time): float32 readouts and every position's state; the
/// probe's and the tests' reference, and what runs where [`recur`] declines.
pub fn recur_with_mlx(x: DeltaInputs<'_>) -> Result<(Array, Vec<Array>), Exception> {
    let (q, k) = (x.q.shape()[2], x.v.shape()[2]);
    let repeat = k / q;
    let (q, k) = if repeat > 1 {
        (
            mlx_rs::ops::repeat_axis::<f32>(x.q.clone(), repeat, -2)?,
            mlx_rs::ops::repeat_axis::<f32>(x.k.clone(), repeat, -2)?,
        )
    } else {
        (x.q.clone(), x.k.clone())
    };
    let d = dims(&x).ok_or(Exception::from("gated delta: shapes that do not fit"))?;
    let (b, l, hv) = (d.batch as i32, d.steps as i32, d.value_heads as i32);
    let mut state = x.state.clone();
    let (mut ys, mut states) = (Vec::new(), Vec::new());
    use mlx_rs::ops::indexing::IndexOp;
    for s in 0..l {
        let (qs, ks, vs) = (q.index((.., s)), k.index((.., s)), x.v.index((.., s)));
        let (gs, bs) = (x.g.index((.., s)), x.beta.index((.., s)));
        state = state.multiply(gs.reshape(&[b, hv, 1, 1])?)?;
        let k_row = ks.expand_dims(-2)?;
        let kv_mem = state.multiply(&k_row)?.sum_axis(-1, false)?;
        let delta = vs.subtract(&kv_mem)?.multiply(bs.expand_dims(-1)?)?;
        state = state.add(k_row.multiply(delta.expand_dims(-1)?)?)?;
        ys.push(state.multiply(qs.expand_dims(-2)?)?.sum_axis(-1, false)?);
        states.push(state.clone());
    }
    Ok((mlx_rs::ops::stack(&ys, 1)?, states))
}

/// Whether [`recur`] gives the bits of MLX's ops here: checked once per
/// process on random inputs of a real model's head sizes, with grouped
/// heads, zero and large decays.
pub fn matches_mlx() -> bool {
    static MATCHES: OnceLock<bool> = OnceLock::new();
    *MATCHES.get_or_init(|| probe(&[1, 3, 2, 128], 4, 64).unwrap_or(false))
}

/// [`recur`] against [`recur_with_mlx`] on random inputs: queries and keys
/// `qk_shape`, `value_heads` value heads of `value_dim`.
fn probe(qk_shape: &[i32; 4], value_heads: i32, value_dim: i32) -> Result<bool, Exception> {
    let [b, l, _, dk] = *qk_shape;
    let key = mlx_rs::random::key(11)?;
    let normal = |shape: &[i32], scale: f32| -> Result<Array, Exception> {
        mlx_rs::random::normal::<f32>(shape, None, Some(scale), &key)
    };
    let q = normal(qk_shape, 0.1)?;
    let k = normal(qk_shape, 0.1)?.add(Array::from_f32(0.01))?;
    let v = normal(&[b, l, value_heads, value_dim], 1.0)?;
    let g = mlx_rs::random::uniform::<f32, f32>(0.0, 1.0, &[b, l, value_heads], &key)?;
    let beta = mlx_rs::random::uniform::<f32, f32>(0.0, 1.0, &[b, l, value_heads], &key)?;
    let state = normal(&[b, value_heads, value_dim, dk], 3.0)?;
    let x = DeltaInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        state: &state,
    };
    let Some(ours) = recur_unchecked(x, 0)? else {
        return Ok(false);
    };
    let (y, states) = recur_with_mlx(x)?;
    Ok(same(&ours.y, &y)?
        && ours.kept.len() == states.len()
        && ours
            .kept
            .iter()
            .zip(&states)
            .map(|(a, b)| same(a, b))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .all(|s| s))
}

/// Whether two float32 arrays of one shape hold the same bits.
fn same(ours: &Array, theirs: &Array) -> Result<bool, Exception> {
    if ours.shape() != theirs.shape() {
        return Ok(false);
    }
    let ours = ours.contiguous()?;
    ours.eval()?;
    match ours.try_as_slice::<f32>() {
        Ok(o) => crate::vector::same_bits(o, &theirs.contiguous()?),
        Err(_) => Ok(false),
    }
}

/// The element kernel, compiled for AVX-512, AVX2 and the baseline.
mod kernel {
    /// One position's inputs for one head.
    pub(super) struct Position<'a> {
        pub q: &'a [f32],
        pub k: &'a [f32],
        pub v: &'a [f32],
        pub g: f32,
        pub beta: f32,
    }

    /// One position of one head over its transposed state `work`
    /// (`[key_dim, value_dim]`); `scratch` holds `value_dim` floats.
    #[inline(always)]
    fn generic(work: &mut [f32], x: &Position<'_>, scratch: &mut [f32], y: &mut [f32]) {
        let dv = x.v.len();
        let memory = &mut scratch[..dv];
        memory.fill(0.0);
        // `S = S * g` and `m = sum_k(S * k)`, each value's sum in key order.
        for (row, &kx) in work.chunks_exact_mut(dv).zip(x.k) {
            for (s, m) in row.iter_mut().zip(memory.iter_mut()) {
                let e = *s * x.g;
                *s = e;
                *m += e * kx;
            }
        }
        // `d = (v - m) * beta`, in place of `m`.
        for (m, vx) in memory.iter_mut().zip(x.v) {
            *m = (*vx - *m) * x.beta;
        }
        // `S = S + k * d` and `y = sum_k(S * q)`.
        y.fill(0.0);
        for (row, (&kx, &qx)) in work.chunks_exact_mut(dv).zip(x.k.iter().zip(x.q)) {
            for ((s, dx), out) in row.iter_mut().zip(memory.iter()).zip(y.iter_mut()) {
                let e = *s + kx * *dx;
                *s = e;
                *out += e * qx;
            }
        }
    }

    crate::vector::vectorised! {
        fn position(work: &mut [f32], x: &Position<'_>, scratch: &mut [f32], y: &mut [f32]) {
            generic(work, x, scratch, y)
        }
    }
}

#[cfg(test)]
mod tests;
