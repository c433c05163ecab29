//! Finding where in a JSON schema llguidance's error lies: llguidance
//! names the problem but not the place, so on an error the subschemas are
//! compiled alone, descending into the one that fails the same way.

use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::ParserFactory;
use serde_json::Value;

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "additionalProperties",
    "items",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// Keywords whose value is a map of subschemas.
const MAP: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];

/// Keywords whose value is a list of subschemas.
const LIST: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems", "items"];

/// At most this many subschemas are compiled looking for the place, for
/// at most this long: the search only makes an error message better.
const MAX_TRIES: usize = 256;
const MAX_TIME: Duration = Duration::from_millis(250);

/// The JSON pointer of the deepest subschema of `root` that fails to
/// compile on its own with `message` (the root's `$defs` and `definitions`
/// lent to it), or `None` where no subschema does or the search is too long
/// (past [`MAX_TRIES`] compilations or [`MAX_TIME`]).
pub(crate) fn locate(factory: &ParserFactory, root: &Value, message: &str) -> Option<String> {
    let start = Instant::now();
    let mut tries = 0;
    let mut path = String::new();
    let mut node = root;
    'descend: loop {
        for (segment, child) in children(node) {
            tries += 1;
            if tries > MAX_TRIES || start.elapsed() > MAX_TIME {
                tracing::debug!("gave up looking for the schema path after {tries} tries");
                return None;
            }
            if fails_alone(factory, root, child, message) {
                path.push('/');
                path.push_str(&segment);
                node = child;
                continue 'descend;
            }
        }
        return (!path.is_empty()).then_some(path);
    }
}

/// The subschemas directly under `node`, with their pointer segments
/// (`properties/name` is two).
fn children(node: &Value) -> Vec<(String, &Value)> {
    let Some(object) = node.as_object() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, value) in object {
        if ONE.contains(&key.as_str()) && value.is_object() {
            out.push((key.clone(), value));
        } else if MAP.contains(&key.as_str()) {
            for (name, child) in value.as_object().into_iter().flatten() {
                out.push((format!("{key}/{}", escape(name)), child));
            }
        } else if LIST.contains(&key.as_str()) {
            for (i, child) in value.as_array().into_iter().flatten().enumerate() {
                out.push((format!("{key}/{i}"), child));
            }
        }
    }
    out
}

/// A name as one JSON pointer segment.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn fails_alone(factory: &ParserFactory, root: &Value, child: &Value, message: &str) -> bool {
    let mut schema = child.clone();
    if let Some(object) = schema.as_object_mut() {
        for defs in ["$defs", "definitions"] {
            if let Some(value) = root.get(defs) {
                object.entry(defs).or_insert_with(|| value.clone());
            }
        }
    } else {
        return false;
    }
    let grammar = TopLevelGrammar::from_json_schema(schema);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        factory.create_parser(grammar)
    }));
    matches!(result, Ok(Err(e)) if format!("{e:#}") == message)
}
