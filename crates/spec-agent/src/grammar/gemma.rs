//! Gemma 4's value notation as grammar rules, following a JSON schema:
//! strings between `<|"|>` marks, bare numbers and booleans, `{key:value}`
//! objects with their keys in sorted order (as the template's `dictsort`
//! writes them) and `[..]` arrays.

use serde_json::Value;

use super::lark::{quote, Lark};
use crate::tools::schema_type;

const QUOTE: &str = "<|\"|>";
const NUMBER: &str = r#"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"#;
const INTEGER: &str = r#"/-?(0|[1-9][0-9]*)/"#;

/// How many local `$ref`s deep values are spelled out; past it (a
/// recursive schema), any value. Small: a schema that refers to itself
/// twice doubles the grammar at each level.
const MAX_DEPTH: usize = 6;

/// The arguments of a tool whose parameters are `schema`.
pub(super) fn arguments(g: &mut Lark, schema: &Value) -> String {
    object(g, schema, schema, 0)
}

/// An object valid under `schema` (a part of `root`, which holds its
/// `$ref` targets): its declared properties, sorted, the required ones
/// present; any keys when it declares none.
fn object(g: &mut Lark, schema: &Value, root: &Value, depth: usize) -> String {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return generic_object(g);
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut entries: Vec<(&String, &Value)> = properties.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let items: Vec<(String, bool)> = entries
        .into_iter()
        .map(|(key, schema)| {
            let value = value(g, schema, root, depth);
            (
                format!("{} {value}", quote(&format!("{key}:"))),
                required.contains(&key.as_str()),
            )
        })
        .collect();
    let body = first(&items).unwrap_or_default();
    g.rule("gobj", "", &format!("\"{{\" {body} \"}}\""))
}

/// The entries from the first present one on: no comma before it.
fn first(items: &[(String, bool)]) -> Option<String> {
    let ((item, required), rest) = items.split_first()?;
    let then = rest_of(rest);
    let with_this = match &then {
        Some(then) => format!("{item} {then}"),
        None => item.clone(),
    };
    if *required {
        return Some(with_this);
    }
    Some(match first(rest) {
        Some(without) => format!("({with_this} | {without})?"),
        None => format!("({with_this})?"),
    })
}

/// The entries after one that is present: each after a comma.
fn rest_of(items: &[(String, bool)]) -> Option<String> {
    let parts: Vec<String> = items
        .iter()
        .map(|(item, required)| {
            if *required {
                format!("\",\" {item}")
            } else {
                format!("(\",\" {item})?")
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// A value valid under `schema`.
fn value(g: &mut Lark, schema: &Value, root: &Value, depth: usize) -> String {
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        let resolved = target
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer));
        return match resolved {
            Some(resolved) if depth < MAX_DEPTH => value(g, resolved, root, depth + 1),
            _ => generic(g),
        };
    }
    match schema_type(schema) {
        Some("string") => match schema.get("enum").and_then(Value::as_array) {
            Some(options) => {
                let options: Vec<String> = options
                    .iter()
                    .filter_map(Value::as_str)
                    .map(quote)
                    .collect();
                let quote_mark = g.lit(QUOTE);
                format!("{quote_mark} ({}) {quote_mark}", options.join(" | "))
            }
            None => string(g),
        },
        Some("integer") => INTEGER.to_owned(),
        Some("number") => NUMBER.to_owned(),
        Some("boolean") => "(\"true\" | \"false\")".to_owned(),
        Some("null") => "\"null\"".to_owned(),
        Some("object") => object(g, schema, root, depth),
        Some("array") => {
            let item = match schema.get("items") {
                Some(items) if items.is_object() => value(g, items, root, depth),
                _ => generic(g),
            };
            g.rule(
                "garr",
                "",
                &format!("\"[\" ({item} (\",\" {item})*)? \"]\""),
            )
        }
        _ => generic(g),
    }
}

fn string(g: &mut Lark) -> String {
    g.shared("gstr", |g| {
        let open = g.lit(QUOTE);
        let text = g.text_through(QUOTE);
        format!("{open} {text}")
    })
}

/// Any value (the rules `gval`, `gobj_any`, `garr_any`, written once).
fn generic(g: &mut Lark) -> String {
    g.shared("gval", |g| {
        let string = string(g);
        let object = g.shared("gobj_any", |_| {
            let entry = format!("(/[A-Za-z_][A-Za-z0-9_]*/ | {string}) \":\" gval");
            format!("\"{{\" ({entry} (\",\" {entry})*)? \"}}\"")
        });
        let array = g.shared("garr_any", |_| {
            "\"[\" (gval (\",\" gval)*)? \"]\"".to_owned()
        });
        format!("{string} | {NUMBER} | \"true\" | \"false\" | \"null\" | {object} | {array}")
    })
}

/// An object with any keys.
fn generic_object(g: &mut Lark) -> String {
    generic(g);
    "gobj_any".to_owned()
}
