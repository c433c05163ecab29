//! Bad grammars are errors that name the problem; grammars past the limits
//! are errors too.

use serde_json::json;

use super::*;
use crate::{GrammarError, GrammarKind, GrammarLimits};

fn error(spec: GrammarSpec) -> GrammarError {
    env().constraint(&spec).expect_err("refused")
}

#[test]
fn invalid_schema_names_the_problem() {
    let err = error(GrammarSpec::JsonSchema(json!({ "type": 5 })));
    eprintln!("{err}");
    assert!(
        matches!(
            &err,
            GrammarError::Invalid {
                kind: GrammarKind::JsonSchema,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("type"), "{err}");

    let nested = json!({
        "type": "object",
        "properties": { "inner": { "type": "object", "properties": { "x": { "type": "strin" } } } }
    });
    let err = error(GrammarSpec::JsonSchema(nested));
    eprintln!("{err}");
    assert!(err.to_string().contains("strin"), "{err}");
    assert!(
        matches!(&err, GrammarError::Invalid { path: Some(p), .. } if p == "/properties/inner/properties/x"),
        "{err:?}"
    );

    // Inside a definition reached through a reference, in a list.
    let referenced = json!({
        "$defs": { "Thing": { "anyOf": [{ "type": "integer" }, { "type": "string", "format": "no-such-format" }] } },
        "type": "object",
        "properties": { "v": { "$ref": "#/$defs/Thing" } }
    });
    let err = error(GrammarSpec::JsonSchema(referenced));
    eprintln!("{err}");
    assert!(
        matches!(&err, GrammarError::Invalid { path: Some(p), .. } if p == "/$defs/Thing/anyOf/1"),
        "{err:?}"
    );
}

#[test]
fn invalid_regex_and_lark_name_the_problem() {
    let err = error(GrammarSpec::Regex("(ab".into()));
    eprintln!("{err}");
    assert!(
        matches!(
            &err,
            GrammarError::Invalid {
                kind: GrammarKind::Regex,
                ..
            }
        ),
        "{err:?}"
    );

    let err = error(GrammarSpec::Lark("start: missing_rule\n".into()));
    eprintln!("{err}");
    assert!(
        matches!(
            &err,
            GrammarError::Invalid {
                kind: GrammarKind::Lark,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("missing_rule"), "{err}");

    let err = error(GrammarSpec::Lark("start: \"a\" |\n  ) (\n".into()));
    eprintln!("{err}");
    assert!(matches!(
        &err,
        GrammarError::Invalid {
            kind: GrammarKind::Lark,
            ..
        }
    ));
}

/// A schema with `n` required string properties.
fn wide_schema(n: usize) -> serde_json::Value {
    let properties: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| (format!("field_{i}"), json!({ "type": "string" })))
        .collect();
    let required: Vec<String> = properties.keys().cloned().collect();
    json!({ "type": "object", "properties": properties, "required": required })
}

#[test]
fn grammars_past_the_limits_are_errors() {
    let tokenizer = gguf_tokenizer();
    let vocab = tokenizer.vocab_size();
    let mut limits = GrammarLimits::default();
    limits.parser.max_grammar_size = 200;
    let small = TokenEnv::with_limits(tokenizer.clone(), vocab, limits).expect("env");
    small
        .constraint(&GrammarSpec::JsonSchema(wide_schema(2)))
        .expect("a small schema fits");
    let err = small
        .constraint(&GrammarSpec::JsonSchema(wide_schema(200)))
        .expect_err("too large");
    eprintln!("{err}");
    assert!(
        matches!(
            &err,
            GrammarError::TooComplex {
                kind: GrammarKind::JsonSchema,
                ..
            }
        ),
        "{err:?}"
    );

    let limits = GrammarLimits {
        max_source_bytes: 100,
        ..GrammarLimits::default()
    };
    let small = TokenEnv::with_limits(tokenizer, vocab, limits).expect("env");
    let err = small
        .constraint(&GrammarSpec::Regex("a".repeat(101)))
        .expect_err("too long");
    assert!(matches!(
        err,
        GrammarError::SourceTooLarge {
            bytes: 101,
            limit: 100,
            ..
        }
    ));

    // With the default limits: a schema of more than 50,000 subschemas.
    let many: Vec<serde_json::Value> = (0..60_000).map(|_| json!({})).collect();
    let err = error(GrammarSpec::JsonSchema(json!({ "anyOf": many })));
    eprintln!("{err}");
    assert!(
        matches!(
            &err,
            GrammarError::TooComplex {
                kind: GrammarKind::JsonSchema,
                ..
            }
        ),
        "{err:?}"
    );

    // The default source bound.
    let err = error(GrammarSpec::Regex("a".repeat((1 << 20) + 1)));
    assert!(
        matches!(err, GrammarError::SourceTooLarge { .. }),
        "{err:?}"
    );

    // Lexer fuel: many literal alternatives.
    let mut limits = GrammarLimits::default();
    limits.parser.initial_lexer_fuel = 2_000;
    let small = TokenEnv::with_limits(gguf_tokenizer(), vocab, limits).expect("env");
    small
        .constraint(&GrammarSpec::Lark("start: \"yes\" | \"no\"\n".into()))
        .expect("a small grammar fits");
    let words: Vec<String> = (0..2_000).map(|i| format!("\"word{i}\"")).collect();
    let err = small
        .constraint(&GrammarSpec::Lark(format!(
            "start: {}\n",
            words.join(" | ")
        )))
        .expect_err("too much fuel");
    eprintln!("{err}");
    assert!(
        matches!(
            &err,
            GrammarError::TooComplex {
                kind: GrammarKind::Lark,
                ..
            }
        ),
        "{err:?}"
    );
}
