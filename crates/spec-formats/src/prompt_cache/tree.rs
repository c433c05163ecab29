//! mlx-lm's prompt-cache tree in both directions: a cache's `state` is a
//! nested list of arrays, integers, strings and `None`; `save_prompt_cache`
//! flattens `[c.state for c in cache]` into tensors named by their path
//! (`"3.0.1"`), turns each non-array leaf into an array and lists it in the
//! metadata (`scalars`, with its kind), and stores
//! `tree_flatten([metadata, class_names, scalars])` as the safetensors
//! metadata (`"0.model"`, `"1.3"`, `"2.5.0"`).

use std::collections::{BTreeMap, HashMap};

use mlx_rs::{Array, Dtype};

use super::Problem;

/// One node of a cache's state.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// A tensor.
    Array(Array),
    /// An integer (mlx-lm's `"scalar"`, stored as an int32 0-d array).
    Int(i64),
    /// A string (mlx-lm's `"string"`, stored as int32 code points).
    Str(String),
    /// Python's `None` (mlx-lm's `"none"`, stored as an empty array).
    None,
    /// A list or tuple.
    List(Vec<Node>),
}

/// The kinds mlx-lm records in its `scalars` list.
const SCALAR: &str = "scalar";
const STRING: &str = "string";
const NONE: &str = "none";

/// Tensors named by path and the `(path, kind)` of each non-array leaf.
pub(crate) type Flat = (Vec<(String, Array)>, Vec<(String, &'static str)>);

/// Flattens the states of a file's entries.
pub(crate) fn flatten(entries: &[Node]) -> Result<Flat, Problem> {
    let mut tensors = Vec::new();
    let mut scalars = Vec::new();
    for (i, node) in entries.iter().enumerate() {
        walk(node, i.to_string(), &mut tensors, &mut scalars)?;
    }
    Ok((tensors, scalars))
}

fn walk(
    node: &Node,
    path: String,
    tensors: &mut Vec<(String, Array)>,
    scalars: &mut Vec<(String, &'static str)>,
) -> Result<(), Problem> {
    match node {
        Node::Array(a) => tensors.push((path, a.clone())),
        Node::Int(v) => {
            let v = i32::try_from(*v)
                .map_err(|_| Problem::Unsupported(format!("{path}: {v} does not fit int32")))?;
            tensors.push((path.clone(), Array::from_int(v)));
            scalars.push((path, SCALAR));
        }
        Node::Str(s) => {
            let codes: Vec<i32> = s.chars().map(|c| c as i32).collect();
            tensors.push((
                path.clone(),
                Array::from_slice(&codes, &[codes.len() as i32]),
            ));
            scalars.push((path, STRING));
        }
        Node::None => {
            tensors.push((path.clone(), Array::from_slice::<f32>(&[], &[0])));
            scalars.push((path, NONE));
        }
        Node::List(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, format!("{path}.{i}"), tensors, scalars)?;
            }
        }
    }
    Ok(())
}

/// The safetensors metadata of a file: `metadata` under `0.`, the class
/// names under `1.`, the scalars list under `2.` (its first item is `""`).
pub(crate) fn metadata(
    user: &BTreeMap<String, String>,
    classes: &[&str],
    scalars: &[(String, &str)],
) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in user {
        out.insert(format!("0.{k}"), v.clone());
    }
    for (i, c) in classes.iter().enumerate() {
        out.insert(format!("1.{i}"), (*c).to_owned());
    }
    out.insert("2.0".into(), String::new());
    for (j, (path, kind)) in scalars.iter().enumerate() {
        out.insert(format!("2.{}.0", j + 1), path.clone());
        out.insert(format!("2.{}.1", j + 1), (*kind).to_owned());
    }
    out
}

/// A file's metadata, read back.
#[derive(Debug, Default)]
pub(crate) struct Header {
    /// The `metadata` dict (`model`, `tokenizer_config`, ours).
    pub(crate) user: BTreeMap<String, String>,
    /// One class name per entry.
    pub(crate) classes: Vec<String>,
    /// `(path, kind)` of each non-array leaf.
    pub(crate) scalars: Vec<(String, String)>,
}

/// Reads the metadata `save_prompt_cache` writes.
pub(crate) fn parse_metadata(meta: &BTreeMap<String, String>) -> Result<Header, Problem> {
    let malformed = |m: String| Problem::Malformed(m);
    let mut header = Header::default();
    let mut classes = BTreeMap::new();
    let mut scalars: BTreeMap<usize, [Option<String>; 2]> = BTreeMap::new();
    for (key, value) in meta {
        let (top, rest) = key.split_once('.').unwrap_or((key.as_str(), ""));
        match top {
            "0" if !rest.is_empty() => {
                header.user.insert(rest.to_owned(), value.clone());
            }
            "1" => {
                let i = index(rest).ok_or_else(|| malformed(format!("class key `{key}`")))?;
                classes.insert(i, value.clone());
            }
            "2" if rest == "0" => {}
            "2" => {
                let (j, field) = rest
                    .split_once('.')
                    .and_then(|(j, f)| Some((index(j)?, index(f)?)))
                    .filter(|&(j, f)| j >= 1 && f <= 1)
                    .ok_or_else(|| malformed(format!("scalars key `{key}`")))?;
                scalars.entry(j).or_default()[field] = Some(value.clone());
            }
            _ => return Err(malformed(format!("unexpected metadata key `{key}`"))),
        }
    }
    header.classes = dense(classes, "class names")?;
    for (j, [path, kind]) in dense(scalars, "scalars")?.into_iter().enumerate() {
        match (path, kind) {
            (Some(p), Some(k)) => header.scalars.push((p, k)),
            _ => return Err(malformed(format!("scalars entry {} is incomplete", j + 1))),
        }
    }
    Ok(header)
}

fn index(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The values of `map` if its keys are `first, first + 1, ..` without gaps
/// (`first` is the smallest key).
fn dense<T>(map: BTreeMap<usize, T>, what: &str) -> Result<Vec<T>, Problem> {
    let first = map.keys().next().copied().unwrap_or(0);
    let mut out = Vec::with_capacity(map.len());
    for (expected, (k, v)) in (first..).zip(map) {
        if k != expected {
            return Err(Problem::Malformed(format!(
                "{what}: index {expected} is missing"
            )));
        }
        out.push(v);
    }
    Ok(out)
}

/// Rebuilds the entries from a file's tensors and scalars list.
pub(crate) fn unflatten(
    tensors: HashMap<String, Array>,
    scalars: &[(String, String)],
) -> Result<Vec<Node>, Problem> {
    let mut leaves: BTreeMap<String, Node> = tensors
        .into_iter()
        .map(|(k, a)| (k, Node::Array(a)))
        .collect();
    for (path, kind) in scalars {
        let Some(Node::Array(a)) = leaves.get(path) else {
            return Err(Problem::Malformed(format!(
                "scalar `{path}` names no tensor"
            )));
        };
        let node = match kind.as_str() {
            SCALAR => Node::Int(read_int(a, path)?),
            STRING => Node::Str(read_string(a, path)?),
            NONE => Node::None,
            other => {
                return Err(Problem::Malformed(format!(
                    "scalar `{path}` has unknown kind `{other}`"
                )))
            }
        };
        leaves.insert(path.clone(), node);
    }
    let mut root = Partial::Branch(BTreeMap::new());
    for (path, node) in leaves {
        let parts = path
            .split('.')
            .map(|p| index(p).ok_or_else(|| Problem::Malformed(format!("tensor name `{path}`"))))
            .collect::<Result<Vec<_>, _>>()?;
        root.insert(&parts, node, &path)?;
    }
    match root.finish()? {
        Node::List(entries) => Ok(entries),
        _ => Err(Problem::Malformed("the file holds no cache list".into())),
    }
}

/// A tree under construction: leaves, or children by index.
enum Partial {
    Leaf(Node),
    Branch(BTreeMap<usize, Partial>),
}

impl Partial {
    fn insert(&mut self, parts: &[usize], node: Node, path: &str) -> Result<(), Problem> {
        let clash = || Problem::Malformed(format!("tensor `{path}` clashes with another"));
        let Partial::Branch(children) = self else {
            return Err(clash());
        };
        match parts {
            [] => Err(clash()),
            [last] => match children.insert(*last, Partial::Leaf(node)) {
                None => Ok(()),
                Some(_) => Err(clash()),
            },
            [first, rest @ ..] => children
                .entry(*first)
                .or_insert_with(|| Partial::Branch(BTreeMap::new()))
                .insert(rest, node, path),
        }
    }

    fn finish(self) -> Result<Node, Problem> {
        match self {
            Partial::Leaf(node) => Ok(node),
            Partial::Branch(children) => {
                if children.keys().next().is_some_and(|&k| k != 0) {
                    return Err(Problem::Malformed("a list does not start at 0".into()));
                }
                dense(children, "a list")?
                    .into_iter()
                    .map(Partial::finish)
                    .collect::<Result<Vec<_>, _>>()
                    .map(Node::List)
            }
        }
    }
}

fn read_int(a: &Array, path: &str) -> Result<i64, Problem> {
    let integral = matches!(
        a.dtype(),
        Dtype::Int8
            | Dtype::Int16
            | Dtype::Int32
            | Dtype::Int64
            | Dtype::Uint8
            | Dtype::Uint16
            | Dtype::Uint32
            | Dtype::Bool
    );
    if a.ndim() != 0 || !integral {
        return Err(Problem::Malformed(format!(
            "scalar `{path}` is a {:?} of shape {:?}, not an integer",
            a.dtype(),
            a.shape()
        )));
    }
    let v = a.as_dtype(Dtype::Int64)?;
    v.eval()?;
    v.as_slice::<i64>()
        .first()
        .copied()
        .ok_or_else(|| Problem::Malformed(format!("scalar `{path}` is empty")))
}

fn read_string(a: &Array, path: &str) -> Result<String, Problem> {
    if a.ndim() != 1 || !matches!(a.dtype(), Dtype::Int32 | Dtype::Int64 | Dtype::Uint32) {
        return Err(Problem::Malformed(format!(
            "string `{path}` is a {:?} of shape {:?}",
            a.dtype(),
            a.shape()
        )));
    }
    let v = a.as_dtype(Dtype::Int64)?;
    v.eval()?;
    v.as_slice::<i64>()
        .iter()
        .map(|&c| {
            u32::try_from(c)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| Problem::Malformed(format!("string `{path}`: code point {c}")))
        })
        .collect()
}
