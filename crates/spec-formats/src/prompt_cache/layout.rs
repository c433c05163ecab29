//! Our caches as mlx-lm's cache classes, both ways: `KvCache` is
//! `KVCache` (`(keys, values, offset)`, the whole buffer: valid rows, then
//! room); `SlidingKvCache` (the sliding layers) is
//! `RotatingKVCache` (`(keys, values, offset, keep, max_size, _idx)`, keep
//! 0), `SinkWindowKvCache` (`--max-kv-size`) one with keep 4; a GLM layer's latent cache and its indexer's key cache are one
//! `CacheList(KVCache, KVCache)` (`deepseek_v32`'s `make_cache`: latent and
//! rope key, then the indexer's keys with zeros as values), a layer without
//! an indexer (IndexShare) a `CacheList` of its latent cache alone; a
//! recurrent layer's cache an `ArraysCache` (`recurrent`); a
//! `QuantizedKvCache` is `QuantizedKVCache` (`((words, scales, biases) of the
//! keys, of the values, offset, group_size, bits)`, the whole buffer).
//!
//! Loading checks every entry against the model: its class, the head
//! counts, widths and dtype of what the model's own caches hold after one
//! token (`probe`), and that the offsets tell the truth (not negative, not
//! past the stored rows, the same in every cache).

use mlx_rs::ops::{concatenate, zeros_like};
use mlx_rs::Array;
use spec_core::{CacheKind, CacheSet, CacheState, LayerCache};

use super::recurrent::{self, ARRAYS_CACHE};
use super::tree::Node;
use super::Problem;
use crate::cache::{rows_of, slice};

/// mlx-lm's class names.
pub(crate) const KV_CACHE: &str = "KVCache";
pub(crate) const ROTATING: &str = "RotatingKVCache";
pub(crate) const CACHE_LIST: &str = "CacheList";
pub(crate) const QUANTIZED: &str = "QuantizedKVCache";

/// One entry of a file: its class and its state.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) class: String,
    pub(crate) state: Node,
}

/// Cache `i`'s state, or why it has no file form.
fn state_of(caches: &CacheSet, i: usize) -> Result<Option<CacheState>, Problem> {
    match caches.get(i) {
        None => Ok(None),
        Some(cache) => match cache.state()? {
            Some(state) => Ok(Some(state)),
            None => Err(no_file_form(i, cache)),
        },
    }
}

fn no_file_form(i: usize, cache: &dyn LayerCache) -> Problem {
    Problem::Unsupported(format!(
        "cache {i} ({}) has no prompt-cache file form",
        describe(cache)
    ))
}

/// The `[keys, values]` of a state's rows (`None` before the first update).
fn two(rows: Option<Vec<Array>>, i: usize) -> Result<Option<[Array; 2]>, Problem> {
    rows.map(|r| {
        <[Array; 2]>::try_from(r)
            .map_err(|r| Problem::Unsupported(format!("cache {i} holds {} arrays, not 2", r.len())))
    })
    .transpose()
}

/// The entries of `caches`, in mlx-lm's classes: each cache as its state
/// says (`LayerCache::state`); a latent cache and the key-only caches after
/// it as one `CacheList`.
pub(crate) fn entries_of(caches: &CacheSet) -> Result<Vec<Entry>, Problem> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(state) = state_of(caches, i)? {
        let entry = match state.kind {
            CacheKind::Linear => linear(KV_CACHE, two(state.rows, i)?.as_ref(), state.offset),
            CacheKind::Window(window) => rotating(i, two(state.rows, i)?, state.offset, window, 0)?,
            CacheKind::SinkWindow { size, sinks } => {
                rotating(i, two(state.rows, i)?, state.offset, size, sinks)?
            }
            CacheKind::Latent => {
                let latent = two(state.rows, i)?;
                let mut parts = vec![listed(linear(KV_CACHE, latent.as_ref(), state.offset))];
                while let Some(keys) = caches
                    .get(i + 1)
                    .map(|c| c.state())
                    .transpose()?
                    .flatten()
                    .filter(|s| s.kind == CacheKind::KeysOnly)
                {
                    let pair = match keys.rows.as_deref() {
                        Some([k]) => Some([k.clone(), zeros_like(k)?]),
                        Some(r) => {
                            return Err(Problem::Unsupported(format!(
                                "cache {} holds {} key arrays, not 1",
                                i + 1,
                                r.len()
                            )))
                        }
                        None => None,
                    };
                    parts.push(listed(linear(KV_CACHE, pair.as_ref(), keys.offset)));
                    i += 1;
                }
                Entry {
                    class: CACHE_LIST.into(),
                    state: Node::List(parts),
                }
            }
            CacheKind::KeysOnly => {
                return Err(Problem::Unsupported(format!(
                    "cache {i} holds keys alone without a latent cache before it"
                )))
            }
            CacheKind::Recurrent => recurrent::entry(state.rows, i)?,
            // Before its start the cache holds float rows (two arrays), as
            // mlx-lm's `KVCache` before it converts.
            CacheKind::Quantized { .. } if state.rows.as_ref().is_some_and(|r| r.len() == 2) => {
                linear(KV_CACHE, two(state.rows, i)?.as_ref(), state.offset)
            }
            CacheKind::Quantized {
                bits, group_size, ..
            } => quantized(i, state.rows, state.offset, bits, group_size)?,
        };
        out.push(entry);
        i += 1;
    }
    Ok(out)
}

/// A cache in a few words (its `Debug` would print its arrays).
fn describe(cache: &dyn LayerCache) -> String {
    format!("offset {}, window {:?}", cache.offset(), cache.window())
}

/// A `CacheList` item: `(state, class)`.
fn listed(entry: Entry) -> Node {
    Node::List(vec![entry.state, Node::Str(entry.class)])
}

fn linear(class: &str, arrays: Option<&[Array; 2]>, len: usize) -> Entry {
    let state = match arrays {
        Some([k, v]) => vec![Node::Array(k.clone()), Node::Array(v.clone())],
        None => vec![Node::None, Node::None],
    };
    let mut state = state;
    state.push(Node::Int(len as i64));
    Entry {
        class: class.into(),
        state: Node::List(state),
    }
}

/// Quantized keys and values in mlx-lm's `QuantizedKVCache` form:
/// `((words, scales, biases) of the keys, of the values, offset,
/// group_size, bits)`, the whole buffer.
fn quantized(
    i: usize,
    rows: Option<Vec<Array>>,
    offset: usize,
    bits: i32,
    group_size: i32,
) -> Result<Entry, Problem> {
    let triple = |a: &[Array]| Node::List(a.iter().cloned().map(Node::Array).collect());
    let (keys, values) = match rows.as_deref() {
        Some(r) if r.len() == 6 => (triple(&r[..3]), triple(&r[3..])),
        Some(r) => {
            return Err(Problem::Unsupported(format!(
                "cache {i} holds {} arrays, not 6",
                r.len()
            )))
        }
        None => (Node::None, Node::None),
    };
    let int = |n: i64| Node::Int(n);
    Ok(Entry {
        class: QUANTIZED.into(),
        state: Node::List(vec![
            keys,
            values,
            int(offset as i64),
            int(group_size.into()),
            int(bits.into()),
        ]),
    })
}

/// A sliding window in mlx-lm's form: the valid rows in time order
/// (`_idx` = their count, every one valid), the first `keep` being the
/// first positions.
fn rotating(
    i: usize,
    rows: Option<[Array; 2]>,
    offset: usize,
    window: usize,
    keep: usize,
) -> Result<Entry, Problem> {
    let held = rows.as_ref().map_or(0, |r| rows_of(&r[0]));
    // mlx-lm grows a short buffer as if it held every position; one rolled
    // back past the window would be read wrongly.
    if held < window && offset > held {
        return Err(Problem::Unsupported(format!(
            "sliding cache {i} holds {held} positions of a {window}-window at offset {offset} (after a rollback): mlx-lm's layout cannot express it"
        )));
    }
    let (k, v) = match rows {
        Some([k, v]) => (Node::Array(k), Node::Array(v)),
        None => (Node::None, Node::None),
    };
    let int = |n: usize| Node::Int(n as i64);
    Ok(Entry {
        class: ROTATING.into(),
        state: Node::List(vec![k, v, int(offset), int(keep), int(window), int(held)]),
    })
}

/// What the model's cache at one index holds per position: `[heads, width]`
/// of keys and values, and the dtype.
#[derive(Debug, Clone)]
struct Expect {
    keys: [i32; 2],
    values: [i32; 2],
    dtype: mlx_rs::Dtype,
}

fn expect_of(probe: &CacheSet, i: usize) -> Result<Expect, Problem> {
    let (k, v) = probe
        .get(i)
        .and_then(|c| c.contents())
        .ok_or_else(|| Problem::Unsupported(format!("the model's cache {i} stays empty")))?;
    let hw = |a: &Array| match a.shape() {
        [_, h, _, w] => Ok([*h, *w]),
        s => Err(Problem::Unsupported(format!(
            "the model's cache {i} holds rows of shape {s:?}"
        ))),
    };
    Ok(Expect {
        keys: hw(&k)?,
        values: hw(&v)?,
        dtype: k.dtype(),
    })
}

/// The caches of a file's entries for a model whose fresh caches are
/// `template` and whose caches after one token are `probe`.
pub(crate) fn caches_from(
    entries: Vec<Entry>,
    template: CacheSet,
    probe: &CacheSet,
) -> Result<CacheSet, Problem> {
    let count = template.len();
    let mut entries = entries.into_iter().enumerate();
    let mut out: Vec<Box<dyn LayerCache>> = Vec::with_capacity(count);
    // Recurrent caches (their place in `out`, their index, their states),
    // restored once the other caches tell the offset.
    let mut pending = Vec::new();
    let mut i = 0;
    while let Some(cache) = template.get(i) {
        let Some((e, entry)) = entries.next() else {
            return Err(Problem::Mismatch(format!(
                "the file holds {} caches, the model needs more (its cache {i} has none)",
                out.len()
            )));
        };
        let want_class = |class: &str| -> Result<(), Problem> {
            if entry.class == class {
                Ok(())
            } else {
                Err(Problem::Mismatch(format!(
                    "entry {e} is a {}, the model's cache there is a {class}",
                    entry.class
                )))
            }
        };
        let kind = match cache.state()? {
            Some(state) => state.kind,
            None => return Err(no_file_form(i, cache)),
        };
        let restore = |cache: &dyn LayerCache, rows: Option<Vec<Array>>, offset: usize| {
            let state = CacheState { kind, rows, offset };
            cache.restored(state).ok_or_else(|| {
                Problem::Unsupported(format!(
                    "the model's cache {i} ({}) cannot take its file state",
                    describe(cache)
                ))
            })
        };
        match kind {
            CacheKind::Linear => {
                want_class(KV_CACHE)?;
                let (arrays, len) = read_linear(&entry.state, &expect_of(probe, i)?, e)?;
                out.push(restore(cache, arrays.map(Vec::from), len)?);
            }
            CacheKind::Window(window) => {
                want_class(ROTATING)?;
                let want = expect_of(probe, i)?;
                let (rows, offset) = read_rotating(&entry.state, (window, 0), &want, e)?;
                out.push(restore(cache, rows.map(Vec::from), offset)?);
            }
            CacheKind::SinkWindow { size, sinks } => {
                want_class(ROTATING)?;
                let want = expect_of(probe, i)?;
                let (rows, offset) = read_rotating(&entry.state, (size, sinks), &want, e)?;
                out.push(restore(cache, rows.map(Vec::from), offset)?);
            }
            CacheKind::Latent => {
                want_class(CACHE_LIST)?;
                let mut keys_only = 0;
                while let Some(next) = template.get(i + 1 + keys_only) {
                    match next.state()? {
                        Some(s) if s.kind == CacheKind::KeysOnly => keys_only += 1,
                        _ => break,
                    }
                }
                let parts = list_of(&entry.state, 1 + keys_only, e)?;
                let (arrays, len) = read_linear(part(&parts[0], e)?, &expect_of(probe, i)?, e)?;
                out.push(restore(cache, arrays.map(Vec::from), len)?);
                for item in &parts[1..] {
                    i += 1;
                    let (arrays, len) = read_linear(part(item, e)?, &expect_of(probe, i)?, e)?;
                    let keys = arrays.map(|[k, _]| vec![k]);
                    let state = CacheState {
                        kind: CacheKind::KeysOnly,
                        rows: keys,
                        offset: len,
                    };
                    let member =
                        template
                            .get(i)
                            .and_then(|c| c.restored(state))
                            .ok_or_else(|| {
                                Problem::Unsupported(format!(
                                    "the model's cache {i} cannot take its file state"
                                ))
                            })?;
                    out.push(member);
                }
            }
            CacheKind::KeysOnly => {
                return Err(Problem::Unsupported(format!(
                    "the model's cache {i} holds keys alone without a latent cache before it"
                )))
            }
            CacheKind::Quantized { .. } if entry.class == KV_CACHE => {
                // A file written before the start: the float rows, each
                // quantized on restoring.
                let (arrays, len) = read_linear(&entry.state, &expect_of(probe, i)?, e)?;
                out.push(restore(cache, arrays.map(Vec::from), len)?);
            }
            CacheKind::Quantized {
                bits,
                group_size,
                start,
            } => {
                want_class(QUANTIZED)?;
                let want = expect_of(probe, i)?;
                let (arrays, len) = read_quantized(&entry.state, bits, group_size, &want, e)?;
                if len < start {
                    return Err(Problem::Mismatch(format!(
                        "entry {e}: quantized at offset {len}, before the model's --quantized-kv-start {start}: the float rows its queries read are not in the file"
                    )));
                }
                out.push(restore(cache, arrays, len)?);
            }
            CacheKind::Recurrent => {
                want_class(ARRAYS_CACHE)?;
                let states = recurrent::read(&entry.state, probe, i, e)?;
                pending.push((out.len(), i, states.clone()));
                out.push(restore(cache, states, 0)?);
            }
        }
        i += 1;
    }
    if !pending.is_empty() {
        let offset = (0..out.len())
            .find(|j| !pending.iter().any(|(at, ..)| at == j))
            .map(|j| out[j].offset())
            .ok_or_else(|| {
                Problem::Unsupported("every cache is recurrent: the file tells no offset".into())
            })?;
        for (at, i, states) in pending {
            let state = CacheState {
                kind: CacheKind::Recurrent,
                rows: states,
                offset,
            };
            if let Some(cache) = template.get(i).and_then(|c| c.restored(state)) {
                out[at] = cache;
            }
        }
    }
    let extra = entries.count();
    if extra > 0 {
        return Err(Problem::Mismatch(format!(
            "the file holds {extra} more caches than the model's {count}"
        )));
    }
    let caches = CacheSet::new(out);
    if let Some(first) = caches.get(0) {
        let offset = first.offset();
        for j in 1..caches.len() {
            if let Some(c) = caches.get(j).filter(|c| c.offset() != offset) {
                return Err(Problem::Offsets(format!(
                    "cache 0 holds {offset} positions, cache {j} holds {}",
                    c.offset()
                )));
            }
        }
    }
    Ok(caches)
}

/// The items of a `CacheList` state, each `(state, class)` with class
/// `KVCache`.
fn list_of(state: &Node, n: usize, e: usize) -> Result<Vec<Node>, Problem> {
    match state {
        Node::List(items) if items.len() == n => Ok(items.clone()),
        Node::List(items) => Err(Problem::Mismatch(format!(
            "entry {e} is a CacheList of {} caches, the model's holds {n}",
            items.len()
        ))),
        _ => Err(Problem::Malformed(format!(
            "entry {e}: CacheList state is not a list"
        ))),
    }
}

fn part(item: &Node, e: usize) -> Result<&Node, Problem> {
    match item {
        Node::List(pair) => match pair.as_slice() {
            [state, Node::Str(class)] if class == KV_CACHE => Ok(state),
            [_, Node::Str(class)] => Err(Problem::Mismatch(format!(
                "entry {e} lists a {class}, the model's holds KVCache"
            ))),
            _ => Err(Problem::Malformed(format!(
                "entry {e}: CacheList item is not (state, class)"
            ))),
        },
        _ => Err(Problem::Malformed(format!(
            "entry {e}: CacheList item is not a list"
        ))),
    }
}

fn int(node: &Node, what: &str, e: usize) -> Result<i64, Problem> {
    match node {
        Node::Int(v) => Ok(*v),
        _ => Err(Problem::Malformed(format!(
            "entry {e}: {what} is not an integer"
        ))),
    }
}

fn count(node: &Node, what: &str, e: usize) -> Result<usize, Problem> {
    let v = int(node, what, e)?;
    usize::try_from(v).map_err(|_| Problem::Offsets(format!("entry {e}: {what} is {v}")))
}

/// Keys and values `[1, heads, T, width]` as the model's cache holds them.
fn pair(k: &Node, v: &Node, want: &Expect, e: usize) -> Result<Option<[Array; 2]>, Problem> {
    let (k, v) = match (k, v) {
        (Node::Array(k), Node::Array(v)) => (k, v),
        (Node::None, Node::None) => return Ok(None),
        _ => {
            return Err(Problem::Malformed(format!(
                "entry {e}: keys and values are not arrays"
            )))
        }
    };
    for (name, a, hw) in [("keys", k, want.keys), ("values", v, want.values)] {
        let ok = matches!(a.shape(), [1, h, _, w] if [*h, *w] == hw);
        if !ok {
            return Err(Problem::Mismatch(format!(
                "entry {e}: {name} of shape {:?}, the model's are [1, {}, T, {}]",
                a.shape(),
                hw[0],
                hw[1]
            )));
        }
        if a.dtype() != want.dtype {
            return Err(Problem::Dtype {
                entry: e,
                found: format!("{:?}", a.dtype()),
                expected: format!("{:?}", want.dtype),
            });
        }
    }
    if rows_of(k) != rows_of(v) {
        return Err(Problem::Malformed(format!(
            "entry {e}: {} key rows but {} value rows",
            rows_of(k),
            rows_of(v)
        )));
    }
    Ok(Some([k.clone(), v.clone()]))
}

/// A `KVCache` state: the buffer and its valid count.
fn read_linear(
    state: &Node,
    want: &Expect,
    e: usize,
) -> Result<(Option<[Array; 2]>, usize), Problem> {
    let Node::List(items) = state else {
        return Err(Problem::Malformed(format!(
            "entry {e}: KVCache state is not a list"
        )));
    };
    let [k, v, offset] = items.as_slice() else {
        return Err(Problem::Malformed(format!(
            "entry {e}: KVCache state of {} items, not (keys, values, offset)",
            items.len()
        )));
    };
    let offset = count(offset, "the offset", e)?;
    let arrays = pair(k, v, want, e)?;
    let stored = arrays.as_ref().map_or(0, |a| rows_of(&a[0]));
    if offset > stored {
        return Err(Problem::Offsets(format!(
            "entry {e}: offset {offset} but only {stored} positions stored"
        )));
    }
    Ok((arrays, offset))
}

/// A `QuantizedKVCache` state: its six arrays (keys' words, scales and
/// biases, then the values'), checked against the model's bits, group size,
/// heads, widths and dtype, and its offset.
fn read_quantized(
    state: &Node,
    bits: i32,
    group_size: i32,
    want: &Expect,
    e: usize,
) -> Result<(Option<Vec<Array>>, usize), Problem> {
    let Node::List(items) = state else {
        return Err(Problem::Malformed(format!(
            "entry {e}: QuantizedKVCache state is not a list"
        )));
    };
    let [k, v, offset, file_group, file_bits] = items.as_slice() else {
        return Err(Problem::Malformed(format!(
            "entry {e}: QuantizedKVCache state of {} items, not (keys, values, offset, group_size, bits)",
            items.len()
        )));
    };
    let (file_group, file_bits) = (
        int(file_group, "group_size", e)?,
        int(file_bits, "bits", e)?,
    );
    if (file_bits, file_group) != (bits.into(), group_size.into()) {
        return Err(Problem::Mismatch(format!(
            "entry {e}: keys and values in {file_bits} bits, groups of {file_group}; the model's cache keeps {bits} bits, groups of {group_size} (--kv-bits, --kv-group-size)"
        )));
    }
    let offset = count(offset, "the offset", e)?;
    let parts = |node: &Node,
                 name: &str,
                 [heads, width]: [i32; 2]|
     -> Result<Option<Vec<Array>>, Problem> {
        let items = match node {
            Node::None => return Ok(None),
            Node::List(items) if items.len() == 3 => items,
            _ => {
                return Err(Problem::Malformed(format!(
                    "entry {e}: {name} are not (words, scales, biases)"
                )))
            }
        };
        let widths = [width * bits / 32, width / group_size, width / group_size];
        let mut arrays = Vec::with_capacity(3);
        for (part, (item, w)) in ["words", "scales", "biases"]
            .iter()
            .zip(items.iter().zip(widths))
        {
            let Node::Array(a) = item else {
                return Err(Problem::Malformed(format!(
                    "entry {e}: {name}' {part} are not an array"
                )));
            };
            if !matches!(a.shape(), [1, h, _, x] if *h == heads && *x == w) {
                return Err(Problem::Mismatch(format!(
                    "entry {e}: {name}' {part} of shape {:?}, the model's are [1, {heads}, T, {w}]",
                    a.shape()
                )));
            }
            let dtype = if *part == "words" {
                mlx_rs::Dtype::Uint32
            } else {
                want.dtype
            };
            if a.dtype() != dtype {
                return Err(Problem::Dtype {
                    entry: e,
                    found: format!("{:?}", a.dtype()),
                    expected: format!("{dtype:?}"),
                });
            }
            arrays.push(a.clone());
        }
        Ok(Some(arrays))
    };
    let arrays = match (
        parts(k, "keys", want.keys)?,
        parts(v, "values", want.values)?,
    ) {
        (Some(mut keys), Some(values)) => {
            keys.extend(values);
            Some(keys)
        }
        (None, None) => None,
        _ => {
            return Err(Problem::Malformed(format!(
                "entry {e}: keys and values are not both stored"
            )))
        }
    };
    let stored = arrays
        .as_ref()
        .map(|a| a.iter().map(rows_of).collect::<Vec<_>>());
    let held = match stored.as_deref() {
        Some([first, rest @ ..]) if rest.iter().all(|r| r == first) => *first,
        Some(rows) => {
            return Err(Problem::Malformed(format!(
                "entry {e}: its arrays hold {rows:?} rows"
            )))
        }
        None => 0,
    };
    if offset > held {
        return Err(Problem::Offsets(format!(
            "entry {e}: offset {offset} but only {held} positions stored"
        )));
    }
    Ok((arrays, offset))
}

/// A `RotatingKVCache` state: the valid rows in time order (mlx-lm's
/// `_temporal_order`: the `sinks` kept first) and the offset, for a model
/// whose cache there is `(window, sinks)`.
fn read_rotating(
    state: &Node,
    (window, sinks): (usize, usize),
    want: &Expect,
    e: usize,
) -> Result<(Option<[Array; 2]>, usize), Problem> {
    let Node::List(items) = state else {
        return Err(Problem::Malformed(format!(
            "entry {e}: RotatingKVCache state is not a list"
        )));
    };
    let [k, v, offset, keep, max_size, idx] = items.as_slice() else {
        return Err(Problem::Malformed(format!(
            "entry {e}: RotatingKVCache state of {} items, not (keys, values, offset, keep, max_size, _idx)",
            items.len()
        )));
    };
    let keep = int(keep, "keep", e)?;
    if keep != sinks as i64 {
        let model = match sinks {
            0 => "the model's sliding window keeps none".to_string(),
            n => format!("the model's (--max-kv-size) keeps {n}"),
        };
        return Err(Problem::Mismatch(format!(
            "entry {e}: a rotating cache that keeps its first {keep} positions (mlx-lm's --max-kv-size keeps 4); {model}"
        )));
    }
    let max_size = int(max_size, "max_size", e)?;
    if max_size != window as i64 {
        return Err(Problem::Mismatch(format!(
            "entry {e}: a window of {max_size}, the model's is {window}"
        )));
    }
    let offset = count(offset, "the offset", e)?;
    let idx = count(idx, "_idx", e)?;
    let Some(arrays) = pair(k, v, want, e)? else {
        if offset != 0 || idx != 0 {
            return Err(Problem::Offsets(format!(
                "entry {e}: offset {offset} and _idx {idx} over no stored rows"
            )));
        }
        return Ok((None, 0));
    };
    let t = rows_of(&arrays[0]);
    let lie = |m: String| Err(Problem::Offsets(format!("entry {e}: {m}")));
    if idx > t {
        return lie(format!("_idx {idx} past the {t} stored rows"));
    }
    let rows = if idx == t {
        if offset < t {
            return lie(format!("offset {offset} but {t} positions stored"));
        }
        arrays
    } else if idx < offset {
        if t > window {
            return lie(format!("a ring of {t} rows over a {window}-window"));
        }
        let mut out = Vec::with_capacity(2);
        if idx < sinks {
            return lie(format!(
                "_idx {idx} inside the {sinks} kept positions of a ring"
            ));
        }
        for a in &arrays {
            let parts = [slice(a, 0, sinks), slice(a, idx, t), slice(a, sinks, idx)];
            out.push(concatenate(&parts, 2)?);
        }
        match <[Array; 2]>::try_from(out) {
            Ok(r) => r,
            Err(_) => return Err(Problem::Malformed(format!("entry {e}: lost an array"))),
        }
    } else {
        if idx != offset {
            return lie(format!("_idx {idx} past offset {offset}"));
        }
        arrays.map(|a| slice(&a, 0, idx))
    };
    let held = rows_of(&rows[0]);
    // A window that keeps its first positions holds all `window` of them
    // (mlx-lm's ring, once full, is never shorter).
    let needed = offset.min(window.saturating_sub(usize::from(sinks == 0)));
    if held < needed {
        return lie(format!(
            "{held} positions held at offset {offset}; the next query needs {needed}"
        ));
    }
    Ok((Some(rows), offset))
}
