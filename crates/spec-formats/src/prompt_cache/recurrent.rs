//! A recurrent layer's cache (`CacheKind::Recurrent`, a Gated DeltaNet
//! layer's conv and recurrent states) as mlx-lm's `ArraysCache` of two:
//! its state is `(cache, left_padding, lengths)`, `cache` the two arrays
//! (both `None` before the first token), no padding and no lengths for one
//! request. mlx-lm keeps no offset in it: the reader takes the offset the
//! file's other caches hold.

use mlx_rs::Array;
use spec_core::CacheSet;

use super::layout::Entry;
use super::tree::Node;
use super::Problem;

/// mlx-lm's class name.
pub(crate) const ARRAYS_CACHE: &str = "ArraysCache";

/// The entry of a recurrent cache holding `states` (`None` before the
/// first token).
pub(crate) fn entry(states: Option<Vec<Array>>, i: usize) -> Result<Entry, Problem> {
    let cache = match states {
        Some(arrays) if arrays.len() == 2 => arrays.into_iter().map(Node::Array).collect(),
        Some(arrays) => {
            return Err(Problem::Unsupported(format!(
                "cache {i} holds {} recurrent states, not 2",
                arrays.len()
            )))
        }
        None => vec![Node::None, Node::None],
    };
    Ok(Entry {
        class: ARRAYS_CACHE.into(),
        state: Node::List(vec![Node::List(cache), Node::None, Node::None]),
    })
}

/// The two states of entry `e`, checked against the shapes and dtypes the
/// model's cache `i` holds after one token (`probe`).
pub(crate) fn read(
    state: &Node,
    probe: &CacheSet,
    i: usize,
    e: usize,
) -> Result<Option<Vec<Array>>, Problem> {
    let malformed = |m: &str| Problem::Malformed(format!("entry {e}: ArraysCache {m}"));
    let Node::List(items) = state else {
        return Err(malformed("state is not a list"));
    };
    let [cache, padding, lengths] = items.as_slice() else {
        return Err(malformed("state is not (cache, left_padding, lengths)"));
    };
    if !matches!((padding, lengths), (Node::None, Node::None)) {
        return Err(Problem::Unsupported(format!(
            "entry {e}: an ArraysCache of a padded batch (left_padding or lengths set); one request's cache has neither"
        )));
    }
    let Node::List(arrays) = cache else {
        return Err(malformed("cache is not a list"));
    };
    let want = probe
        .get(i)
        .map(|c| c.state())
        .transpose()?
        .flatten()
        .and_then(|s| s.rows)
        .ok_or_else(|| Problem::Unsupported(format!("the model's cache {i} stays empty")))?;
    if arrays.len() != want.len() {
        return Err(Problem::Mismatch(format!(
            "entry {e} holds {} arrays, the model's recurrent cache {}",
            arrays.len(),
            want.len()
        )));
    }
    if arrays.iter().all(|a| matches!(a, Node::None)) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(arrays.len());
    for (k, (node, want)) in arrays.iter().zip(&want).enumerate() {
        let Node::Array(a) = node else {
            return Err(malformed(&format!("state {k} is not an array")));
        };
        let fits = a.shape().first() == Some(&1)
            && a.ndim() == want.ndim()
            && a.shape().get(1..) == want.shape().get(1..);
        if !fits {
            return Err(Problem::Mismatch(format!(
                "entry {e}: state {k} of shape {:?}, the model's is {:?}",
                a.shape(),
                want.shape()
            )));
        }
        if a.dtype() != want.dtype() {
            return Err(Problem::Dtype {
                entry: e,
                found: format!("{:?}", a.dtype()),
                expected: format!("{:?}", want.dtype()),
            });
        }
        out.push(a.clone());
    }
    Ok(Some(out))
}
