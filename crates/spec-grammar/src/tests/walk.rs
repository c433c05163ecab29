//! Random generation under each kind of grammar gives text that matches it.

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

use super::*;

pub(super) fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 12 },
            "age": { "type": "integer", "minimum": 0, "maximum": 150 },
            "color": { "enum": ["red", "green", "blue"] },
            "tags": {
                "type": "array",
                "items": { "type": "string", "maxLength": 8 },
                "maxItems": 3
            }
        },
        "required": ["name", "age", "color", "tags"],
        "additionalProperties": false
    })
}

#[test]
fn json_schema_walk_gives_valid_objects() {
    for seed in 0..4 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = compile(&GrammarSpec::JsonSchema(person_schema()));
        let ids = random_walk(&mut c, &mut rng, 0.0, 2000);
        let text = decode(&ids);
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} is not JSON: {e}"));
        let object = value.as_object().expect("an object");
        assert_eq!(object.len(), 4, "{text}");
        let name = object["name"].as_str().expect("name is a string");
        assert!(name.chars().count() <= 12, "{text}");
        let age = object["age"].as_i64().expect("age is an integer");
        assert!((0..=150).contains(&age), "{text}");
        let color = object["color"].as_str().expect("color is a string");
        assert!(["red", "green", "blue"].contains(&color), "{text}");
        let tags = object["tags"].as_array().expect("tags is an array");
        assert!(tags.len() <= 3, "{text}");
        for tag in tags {
            let tag = tag.as_str().expect("a tag is a string");
            assert!(tag.chars().count() <= 8, "{text}");
        }
        assert!(c.is_complete(), "{text}");
        eprintln!("seed {seed}: {} tokens: {text}", ids.len());
    }
}

#[test]
fn json_object_walk_gives_an_object() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut c = compile(&GrammarSpec::JsonObject);
    // An open object can go on for long: stop where it may end.
    let ids = random_walk(&mut c, &mut rng, 0.3, 4000);
    let text = decode(&ids);
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(value.is_object(), "{text}");
}

#[test]
fn regex_walk_matches_the_regex() {
    let pattern = r#"(cat|dog)s? say "[a-z]{2,6}" [0-9]+"#;
    let full = regex::Regex::new(&format!("^(?:{pattern})$")).expect("regex");
    let mut ended_early = false;
    for seed in 0..6 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = compile(&GrammarSpec::Regex(pattern.into()));
        let ids = random_walk(&mut c, &mut rng, 0.3, 200);
        let text = decode(&ids);
        assert!(full.is_match(&text), "seed {seed}: {text:?}");
        ended_early |= !c.is_complete();
    }
    assert!(
        ended_early,
        "[0-9]+ may go on: the walks stopped where it may end"
    );
}

#[test]
fn lark_walk_matches_the_grammar() {
    let grammar = r#"
start: "sum(" num ("," num)* ")"
num: /[0-9]{1,3}/
"#;
    let full = regex::Regex::new(r"^sum\([0-9]{1,3}(,[0-9]{1,3})*\)$").expect("regex");
    for seed in 0..4 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = compile(&GrammarSpec::Lark(grammar.into()));
        let ids = random_walk(&mut c, &mut rng, 0.0, 300);
        let text = decode(&ids);
        assert!(full.is_match(&text), "seed {seed}: {text:?}");
        assert!(c.is_complete());
    }
}

#[test]
fn local_references_resolve() {
    let schema = json!({
        "$defs": {
            "point": {
                "type": "object",
                "properties": { "x": { "type": "integer" }, "y": { "type": "integer" } },
                "required": ["x", "y"],
                "additionalProperties": false
            }
        },
        "type": "array",
        "items": { "$ref": "#/$defs/point" },
        "minItems": 1,
        "maxItems": 2
    });
    let mut rng = StdRng::seed_from_u64(3);
    let mut c = compile(&GrammarSpec::JsonSchema(schema));
    let ids = random_walk(&mut c, &mut rng, 0.0, 2000);
    let text = decode(&ids);
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let points = value.as_array().expect("an array");
    assert!((1..=2).contains(&points.len()), "{text}");
    for point in points {
        let point = point.as_object().expect("a point");
        assert_eq!(point.len(), 2, "{text}");
        assert!(point["x"].is_i64() && point["y"].is_i64(), "{text}");
    }
}
