//! JSON constraints are laid out as Python's `json.dumps` writes JSON unless
//! their schema names a layout of its own.

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

use super::walk::person_schema;
use super::*;
use crate::{json_dumps_layout, with_default_layout, LAYOUT_KEY};

/// Where `text` (JSON) departs from `json.dumps`' layout: whitespace
/// outside strings only as the one space after `,` and `:`.
fn layout_break(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let (mut in_string, mut escaped) = (false, false);
    for (i, &c) in chars.iter().enumerate() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        let after_separator = i > 0 && matches!(chars[i - 1], ',' | ':');
        match c {
            '"' => in_string = true,
            ' ' if after_separator => {}
            c if c.is_whitespace() => return Some(format!("{c:?} at {i}")),
            c if after_separator => return Some(format!("{c:?} right after a separator at {i}")),
            _ => {}
        }
    }
    None
}

#[test]
fn json_constraints_default_to_json_dumps_layout() {
    // An open object's strings are unbounded: seed 7 ends (as in `walk`).
    let schema = GrammarSpec::JsonSchema(person_schema());
    for (name, spec, seed) in [
        ("schema", &schema, 0),
        ("schema", &schema, 1),
        ("schema", &schema, 2),
        ("object", &GrammarSpec::JsonObject, 7),
    ] {
        let mut c = compile(spec);
        let mut rng = StdRng::seed_from_u64(seed);
        let text = decode(&random_walk(&mut c, &mut rng, 0.3, 4000));
        serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        if let Some(at) = layout_break(&text) {
            panic!("{name} seed {seed}: {text:?} breaks json.dumps' layout: {at}");
        }
    }
}

#[test]
fn separators_and_keys_are_forced() {
    let mut c = compile(&GrammarSpec::JsonSchema(person_schema()));
    let first = decode(&c.forced(&[], 64).expect("forced"));
    assert!(first.starts_with(r#"{"name":"#), "{first:?}");
    let prefix = encode(r#"{"name": "Al""#);
    let forced = decode(&c.forced(&prefix, 64).expect("forced"));
    assert!(forced.starts_with(r#", "age":"#), "{forced:?}");
    for off_layout in [r#"{"name":"Al""#, "{\n", r#"{ "name""#] {
        let tokens = encode(off_layout);
        let allowed = c.validate(&tokens).expect("validate");
        assert!(allowed < tokens.len(), "{off_layout:?} is allowed");
    }
}

#[test]
fn a_schema_with_its_own_layout_keeps_it() {
    let mut schema = person_schema();
    schema[LAYOUT_KEY] = json!({ "whitespace_flexible": true });
    let spec = GrammarSpec::JsonSchema(schema.clone());
    assert_eq!(spec.effective_schema(), Some(schema));
    let mut c = compile(&spec);
    let newline = encode("{\n  \"name\"");
    assert_eq!(c.validate(&newline).expect("validate"), newline.len());
}

#[test]
fn effective_schemas() {
    let layout = json_dumps_layout();
    assert_eq!(
        GrammarSpec::JsonObject.effective_schema(),
        Some(json!({ "type": "object", LAYOUT_KEY: layout }))
    );
    assert_eq!(
        GrammarSpec::JsonSchema(json!(true)).effective_schema(),
        Some(json!({ LAYOUT_KEY: layout }))
    );
    assert_eq!(with_default_layout(json!(false)), json!(false));
    assert_eq!(GrammarSpec::Regex("a+".into()).effective_schema(), None);
    assert_eq!(
        GrammarSpec::Lark("start: \"a\"".into()).effective_schema(),
        None
    );
}
