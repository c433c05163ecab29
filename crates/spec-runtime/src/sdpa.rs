//! Scaled dot-product attention with grouped-query heads stacked.
//!
//! On the CPU, MLX's `fast::scaled_dot_product_attention` is a composition:
//! the queries scaled, `Q K^T` with each key head broadcast to the query
//! heads sharing it, the mask (a boolean one selects the scores or the
//! dtype's lowest finite value), a precise softmax over the keys, `P V`.
//! Its matmuls run one `[L, D] x [D, S]` product per query head: a key
//! head's keys are read once for every query head that shares it, and a
//! decoding step (`L = 1`) makes nine single-row products a layer where
//! three would do.
//!
//! [`attention`] runs the same operations with the query heads that share a
//! key head stacked on the row axis (`[B, kv, rep * L, D]`): one product of
//! `rep * L` rows per key head. Every output element is the same reduction
//! over the same inputs (the GEMM front's results do not depend on the row
//! count; the mask, the softmax and the rest are element-wise or per row),
//! so the bits are MLX's own. A probe compares the two once per process
//! ([`exact`]); where they differ (another backend, a fused kernel, another
//! dtype) MLX's function runs. Large score blocks take their softmax from
//! [`mlx_ext::softmax`]: MLX's operations on the vector units, the same bits.
//! Every architecture's attention comes here (the llama family, Gemma-4,
//! GLM's latent attention with its positional scores as an additive mask);
//! with one query head a key head nothing stacks, and only the softmax
//! differs from MLX's function.

use std::sync::OnceLock;

use mlx_ext::quant::Packed;
use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::ops::{arange, expand_dims, softmax_axis};
use mlx_rs::{Array, Dtype};

use spec_core::SpecError;

use crate::ModelError;

/// Scores of at least this many elements are evaluated where they stand and
/// their softmax taken by [`mlx_ext::softmax`] (MLX's bits, vectorised);
/// smaller ones stay in the lazy graph with MLX's op, where the pause to
/// evaluate would cost more than the exponentials.
const EAGER_SOFTMAX: usize = 1 << 14;

/// Which keys each query sees.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// Every key.
    None,
    /// Keys up to the query's own position (the queries are the last `L`
    /// of the `S` positions).
    Causal,
    /// A boolean `[L, S]` or `[B, 1 or heads, L, S]` mask (`true`: seen),
    /// or an additive float one of those shapes.
    Array(&'a Array),
}

impl<'a> Mask<'a> {
    /// `mask` where there is one, else the causal rule for `l > 1` queries
    /// (a lone query sees every key).
    pub fn or_causal(mask: Option<&'a Array>, l: usize) -> Self {
        match mask {
            Some(m) => Mask::Array(m),
            None if l > 1 => Mask::Causal,
            None => Mask::None,
        }
    }
}

/// Attention of `queries` `[B, heads, L, D]` over `keys` and `values`
/// `[B, kv, S, D]` (`kv` dividing `heads`), scores scaled by `scale`:
/// `[B, heads, L, D]`, bit for bit MLX's
/// `fast::scaled_dot_product_attention`.
pub fn attention(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: Mask<'_>,
) -> Result<Array, ModelError> {
    if stackable(queries, keys, mask) && exact() {
        stacked(queries, keys, values, scale, mask)
    } else {
        fused(queries, keys, values, scale, mask)
    }
}

/// [`attention`] with per-head sinks `[heads]` (a logit per head that
/// joins every query's softmax and takes no value: gpt-oss), as MLX's
/// own function computes it.
pub fn attention_with_sinks(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: Mask<'_>,
    sinks: &Array,
) -> Result<Array, ModelError> {
    let mask = match mask {
        Mask::None => None,
        Mask::Causal => Some(ScaledDotProductAttentionMask::Causal),
        Mask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
    };
    Ok(mlx_rs::fast::scaled_dot_product_attention(
        queries, keys, values, scale, mask, sinks,
    )?)
}

/// MLX's own function.
fn fused(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: Mask<'_>,
) -> Result<Array, ModelError> {
    let mask = match mask {
        Mask::None => None,
        Mask::Causal => Some(ScaledDotProductAttentionMask::Causal),
        Mask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
    };
    Ok(mlx_rs::fast::scaled_dot_product_attention(
        queries, keys, values, scale, mask, None,
    )?)
}

/// Whether the shapes stack: one query head or several to a key head, float32
/// (the dtype the probe covers; MLX's lowest-value fill in another dtype
/// is not reproduced here), a mask of a shape [`stacked`] reshapes.
fn stackable(queries: &Array, keys: &Array, mask: Mask<'_>) -> bool {
    let (q, k) = (queries.shape(), keys.shape());
    if q.len() != 4 || k.len() != 4 || queries.dtype() != Dtype::Float32 {
        return false;
    }
    let (heads, kv) = (q[1], k[1]);
    if kv <= 0 || heads < kv || heads % kv != 0 || q[0] != k[0] || q[3] != k[3] {
        return false;
    }
    match mask {
        Mask::None | Mask::Causal => true,
        Mask::Array(m) => {
            let s = m.shape();
            match s.len() {
                2 => true,
                4 => s[1] == 1 || s[1] == heads,
                _ => false,
            }
        }
    }
}

/// The composition with the query heads of each key head stacked.
fn stacked(
    queries: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: Mask<'_>,
) -> Result<Array, ModelError> {
    let (q, k) = (queries.shape(), keys.shape());
    let (b, heads, l, d) = (q[0], q[1], q[2], q[3]);
    let (kv, s) = (k[1], k[2]);
    let rep = heads / kv;
    let scaled = Array::from_f32(scale)
        .as_dtype(queries.dtype())?
        .multiply(queries)?;
    let scores = scaled
        .reshape(&[b, kv, rep * l, d])?
        .matmul(&keys.swap_axes(-1, -2)?)?;
    let scores = match mask {
        Mask::None => scores,
        Mask::Causal => {
            let q_at = arange::<_, i32>(s - l, s, None)?.reshape(&[-1, 1])?;
            let k_at = arange::<_, i32>(0, s, None)?.reshape(&[1, -1])?;
            masked(&scores, &q_at.ge(&k_at)?, [b, kv, rep, l, s])?
        }
        Mask::Array(m) => {
            let shape = m.shape();
            let m = if shape.len() == 4 {
                let per_head = if shape[1] == 1 { [1, 1] } else { [kv, rep] };
                m.reshape(&[shape[0], per_head[0], per_head[1], shape[2], shape[3]])?
            } else {
                m.clone()
            };
            masked(&scores, &m, [b, kv, rep, l, s])?
        }
    };
    let probs = if scores.size() >= EAGER_SOFTMAX {
        mlx_ext::softmax::softmax(&scores)?
    } else {
        softmax_axis(&scores, -1, true)?
    };
    Ok(probs.matmul(values)?.reshape(&[b, heads, l, -1])?)
}

/// Attention of `queries` `[B, heads, L, D]` over quantized `keys` and
/// `values` (`[B, kv, S, ..]` packed along `D`, a quantized KV cache's),
/// as mlx-lm's `quantized_scaled_dot_product_attention` composes it: the
/// queries scaled, with the query heads of a key head on their own axis
/// (`[B, kv, rep, L, D]`), `quantized_matmul` against the keys, the mask (a
/// boolean one keeps a score or puts the lowest finite value, a float one
/// is added), a precise softmax, `quantized_matmul` with the values. MLX's
/// CPU kernels reduce each output over `D` or over the keys in order, so a
/// query's row does not depend on the other rows of its window.
pub fn quantized_attention(
    queries: &Array,
    keys: &Packed,
    values: &Packed,
    scale: f32,
    mask: Mask<'_>,
) -> Result<Array, ModelError> {
    let q = queries.shape();
    let k = keys.weight().shape();
    if q.len() != 4 || k.len() != 4 {
        return Err(SpecError::from(spec_core::InputError::Shape {
            what: "quantized attention",
            expected: "queries [B, heads, L, D] and keys [B, kv, S, ..]".into(),
            got: vec![q.to_vec(), k.to_vec()],
        })
        .into());
    }
    let (b, heads, l, d) = (q[0], q[1], q[2], q[3]);
    let kv = k[1];
    if kv <= 0 || heads % kv != 0 {
        return Err(SpecError::from(spec_core::InputError::Shape {
            what: "quantized attention heads",
            expected: "a multiple of the key heads".into(),
            got: vec![q.to_vec(), k.to_vec()],
        })
        .into());
    }
    let rep = heads / kv;
    let scaled = Array::from_f32(scale)
        .as_dtype(queries.dtype())?
        .multiply(queries)?;
    let (scaled, keys, values) = if rep > 1 {
        let spread = |p: &Packed| -> Result<Packed, ModelError> {
            let axis = |a: &Array| expand_dims(a, -3);
            let biases = p.biases().map(axis).transpose()?;
            Ok(Packed::from_parts(
                axis(p.weight())?,
                axis(p.scales())?,
                biases,
                p.params(),
            )?)
        };
        (
            scaled.reshape(&[b, kv, rep, l, d])?,
            spread(keys)?,
            spread(values)?,
        )
    } else {
        (scaled, keys.clone(), values.clone())
    };
    let scores = keys.matmul(&scaled, true)?;
    let s = scores.dim(-1);
    let lowest = || Array::from_f32(f32::MIN);
    let scores = match mask {
        Mask::None => scores,
        Mask::Causal => {
            let q_at = arange::<_, i32>(s - l, s, None)?.reshape(&[-1, 1])?;
            let k_at = arange::<_, i32>(0, s, None)?.reshape(&[1, -1])?;
            mlx_rs::ops::select(&q_at.ge(&k_at)?, &scores, lowest())?
        }
        Mask::Array(m) => {
            let m = if rep > 1 && m.ndim() > 3 {
                expand_dims(m, -3)?
            } else {
                m.clone()
            };
            if m.dtype() == Dtype::Bool {
                mlx_rs::ops::select(&m, &scores, lowest())?
            } else {
                scores.add(&m)?
            }
        }
    };
    let probs = softmax_axis(&scores, -1, true)?;
    Ok(values.matmul(&probs, false)?.reshape(&[b, heads, l, -1])?)
}

/// `scores` `[B, kv, rep * L, S]` under `mask` (broadcast against
/// `[B, kv, rep, L, S]`): a boolean mask keeps a score or puts the dtype's
/// lowest finite value, a float one is added.
fn masked(scores: &Array, mask: &Array, shape: [i32; 5]) -> Result<Array, ModelError> {
    let [b, kv, rep, l, s] = shape;
    let split = scores.reshape(&shape)?;
    let out = if mask.dtype() == Dtype::Bool {
        mlx_rs::ops::select(mask, &split, Array::from_f32(f32::MIN))?
    } else {
        split.add(mask)?
    };
    Ok(out.reshape(&[b, kv, rep * l, s])?)
}

/// Whether the stacked composition gives MLX's bits here (float32, the
/// only dtype [`stackable`] admits): checked once per process on small
/// random heads (decoding, a causal window, a boolean mask per row, an
/// additive mask).
fn exact() -> bool {
    static EXACT: OnceLock<bool> = OnceLock::new();
    *EXACT.get_or_init(|| probe().unwrap_or(false))
}

fn probe() -> Result<bool, ModelError> {
    let key = mlx_rs::random::key(7)?;
    let normal = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, &key);
    let (b, heads, kv, d, s) = (2, 6, 2, 16, 21);
    let boolean = mlx_rs::random::uniform::<_, f32>(0.0, 1.0, &[b, 1, 3, s], &key)?
        .gt(Array::from_f32(0.3))?;
    let additive = mlx_rs::ops::select(&boolean, Array::from_f32(0.0), Array::from_f32(-1e9))?;
    for (l, mask, kv) in [
        (1, Mask::None, kv),
        (4, Mask::Causal, heads),
        (4, Mask::Causal, kv),
        (3, Mask::Array(&boolean), kv),
        (3, Mask::Array(&additive), kv),
    ] {
        let (q, k, v) = (
            normal(&[b, heads, l, d])?,
            normal(&[b, kv, s, d])?,
            normal(&[b, kv, s, d])?,
        );
        let ours = stacked(&q, &k, &v, 0.25, mask)?;
        let theirs = fused(&q, &k, &v, 0.25, mask)?;
        let (ours, theirs) = (ours.reshape(&[-1])?, theirs.reshape(&[-1])?);
        mlx_rs::transforms::eval([&ours, &theirs])?;
        let same = ours
            .as_slice::<f32>()
            .iter()
            .zip(theirs.as_slice::<f32>())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    fn bits(a: &Array) -> Result<Vec<u32>, ModelError> {
        let a = a.reshape(&[-1])?;
        a.eval()?;
        Ok(a.as_slice::<f32>().iter().map(|v| v.to_bits()).collect())
    }

    /// The stacked composition equals MLX's function bit for bit on
    /// shapes the models run: SmolLM2's 9 heads over 3 key heads decoding
    /// and prefilling a chunk past a long cache, a sliding window's
    /// `[L, S]` mask, grouped rows' `[B, 1, L, S]` masks, 4 heads to 1,
    /// one query head a key head past the eager softmax's threshold, and
    /// 8 heads over one latent key head with per-head additive scores.
    #[test]
    fn stacked_heads_give_mlx_bits() -> Result<(), ModelError> {
        assert!(exact(), "the probe failed on this machine");
        let key = mlx_rs::random::key(3)?;
        let normal = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, &key);
        let window = crate::mask::window_mask(40, 5, 20, 25, 8)?;
        let rows = mlx_rs::random::uniform::<_, f32>(0.0, 1.0, &[3, 1, 4, 30], &key)?
            .gt(Array::from_f32(0.5))?;
        // Per-head additive scores, as GLM's latent attention passes its
        // positional part.
        let additive = normal(&[1, 8, 30, 90])?;
        let cases: Vec<(i32, i32, i32, i32, i32, i32, Mask<'_>)> = vec![
            (1, 9, 3, 1, 300, 64, Mask::None),
            (1, 9, 3, 37, 300, 64, Mask::Causal),
            (1, 9, 3, 5, 25, 64, Mask::Array(&window)),
            (3, 8, 2, 4, 30, 16, Mask::Array(&rows)),
            (2, 4, 1, 2, 11, 32, Mask::Causal),
            (1, 4, 4, 40, 500, 32, Mask::Causal),
            (1, 8, 1, 30, 90, 16, Mask::Array(&additive)),
        ];
        for (b, heads, kv, l, s, d, mask) in cases {
            let (q, k, v) = (
                normal(&[b, heads, l, d])?,
                normal(&[b, kv, s, d])?,
                normal(&[b, kv, s, d])?,
            );
            assert!(stackable(&q, &k, mask), "{heads}/{kv} heads");
            let ours = attention(&q, &k, &v, 0.125, mask)?;
            let theirs = fused(&q, &k, &v, 0.125, mask)?;
            assert_eq!(ours.shape(), theirs.shape());
            assert!(
                bits(&ours)? == bits(&theirs)?,
                "{b} x {heads}/{kv} heads, {l} queries over {s} keys: bits differ"
            );
        }
        Ok(())
    }

    /// Values narrower than the keys (GLM's latent attention unembeds
    /// them per head): the output takes the values' width, MLX's bits.
    #[test]
    fn values_of_another_width_keep_theirs() -> Result<(), ModelError> {
        let key = mlx_rs::random::key(9)?;
        let normal = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, &key);
        let (q, k, v) = (
            normal(&[1, 4, 2, 48])?,
            normal(&[1, 1, 7, 48])?,
            normal(&[1, 1, 7, 32])?,
        );
        let scores = normal(&[1, 4, 2, 7])?;
        let ours = attention(&q, &k, &v, 0.2, Mask::Array(&scores))?;
        let theirs = fused(&q, &k, &v, 0.2, Mask::Array(&scores))?;
        assert_eq!(ours.shape(), &[1, 4, 2, 32]);
        assert_eq!(ours.shape(), theirs.shape());
        assert!(bits(&ours)? == bits(&theirs)?, "bits differ");
        Ok(())
    }

    /// Shapes that do not stack run MLX's function: more key heads than
    /// query heads, another dtype, a mask of another rank.
    #[test]
    fn unstackable_shapes_are_left_to_mlx() -> Result<(), ModelError> {
        let q = Array::zeros::<f32>(&[1, 4, 2, 8])?;
        let k = Array::zeros::<f32>(&[1, 8, 6, 8])?;
        assert!(!stackable(&q, &k, Mask::None));
        let k2 = Array::zeros::<f32>(&[1, 2, 6, 8])?;
        assert!(stackable(&q, &k2, Mask::Causal));
        let half = q.as_dtype(Dtype::Float16)?;
        assert!(!stackable(&half, &k2.as_dtype(Dtype::Float16)?, Mask::None));
        let odd = Array::from_slice(&[true; 12], &[1, 2, 6]);
        assert!(!stackable(&q, &k2, Mask::Array(&odd)));
        Ok(())
    }

    /// Quantized attention: each query of a causal window gets the bits
    /// it gets alone over the keys up to its own position (decoding after
    /// a verify window), with 9 heads over 3 key heads and with one each,
    /// in 4 and 8 bits; the scores' shape and the output's are the
    /// queries'.
    #[test]
    fn quantized_window_rows_equal_each_query_alone() -> Result<(), ModelError> {
        use mlx_ext::quant::QuantParams;
        let key = mlx_rs::random::key(11)?;
        let normal = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, &key);
        for (heads, kv, width) in [(9, 3, 4), (4, 4, 8)] {
            let (s0, l, d) = (37, 6, 64);
            let params = QuantParams::affine(32, width);
            let keys = Packed::quantize(&normal(&[1, kv, s0 + l, d])?, params)?;
            let values = Packed::quantize(&normal(&[1, kv, s0 + l, d])?, params)?;
            let upto = |p: &Packed, n: i32| -> Result<Packed, ModelError> {
                let cut = |a: &Array| a.index((.., .., 0..n, ..));
                Ok(Packed::from_parts(
                    cut(p.weight()),
                    cut(p.scales()),
                    p.biases().map(cut),
                    params,
                )?)
            };
            let q = normal(&[1, heads, l, d])?;
            let window = quantized_attention(&q, &keys, &values, 0.125, Mask::Causal)?;
            assert_eq!(window.shape(), &[1, heads, l, d]);
            for i in 0..l {
                let one = quantized_attention(
                    &q.index((.., .., i..i + 1, ..)),
                    &upto(&keys, s0 + i + 1)?,
                    &upto(&values, s0 + i + 1)?,
                    0.125,
                    Mask::None,
                )?;
                let row = window.index((.., .., i..i + 1, ..));
                assert!(
                    bits(&one)? == bits(&row)?,
                    "{heads}/{kv} heads, {width} bits: row {i}"
                );
            }
        }
        Ok(())
    }
}
