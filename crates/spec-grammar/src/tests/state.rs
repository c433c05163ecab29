//! The trait's state rules: masks, validate and forced leave the state as
//! they found it; refused tokens are errors; EOS only through `end_allowed`.

use serde_json::json;

use super::*;

fn person() -> GrammarSpec {
    GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": { "type": "string" },
            "age": { "type": "integer" },
            "tags": { "type": "array", "items": { "type": "string" } }
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    }))
}

const PERSON: &str = r#"{"name": "Ann Lee", "age": 31, "tags": ["x", "yz"]}"#;

#[test]
fn masks_equal_committing_one_token_at_a_time() {
    let tokens = encode(PERSON);
    let mut batch = compile(&person());
    let before = mask_now(&mut batch);
    let masks = batch.masks(&tokens).expect("masks");
    assert_eq!(masks.len(), tokens.len() + 1);
    assert_eq!(mask_now(&mut batch), before, "masks restored the state");

    let mut single = compile(&person());
    for (i, &token) in tokens.iter().enumerate() {
        let mask = mask_now(&mut single);
        check_mask(&mask);
        assert_eq!(masks[i], mask, "position {i}");
        assert!(mask.allows(token) || single.validate(&[token]).expect("validate") == 1);
        single.commit(&[token]).expect("commit");
    }
    assert_eq!(masks[tokens.len()], mask_now(&mut single));
    assert!(single.is_complete());
    assert!(masks[tokens.len()].end_allowed);
    assert!(!masks[..tokens.len()].iter().any(|m| m.end_allowed));
    // Different states have different masks: the comparison means something.
    assert_ne!(masks[0], masks[3]);
}

#[test]
fn validate_cuts_at_the_first_refused_token() {
    let prefix = encode(r#"{"name": "#);
    let mut tokens = prefix.clone();
    tokens.extend(encode("5"));
    tokens.extend(encode(r#", "age": 3}"#));
    let mut c = compile(&person());
    let before = mask_now(&mut c);
    assert_eq!(c.validate(&tokens).expect("validate"), prefix.len());
    assert_eq!(
        c.validate(&encode(PERSON)).expect("validate"),
        encode(PERSON).len()
    );
    assert_eq!(mask_now(&mut c), before, "validate does not advance");
    // An EOS id or a padding id is never an ordinary token.
    let eos = *gguf_tokenizer().eos_token_ids().first().expect("eos");
    let mut with_eos = prefix.clone();
    with_eos.push(eos);
    assert_eq!(c.validate(&with_eos).expect("validate"), prefix.len());
    let padding = gguf_tokenizer().vocab_size() as u32 + 1;
    assert_eq!(c.validate(&[padding]).expect("validate"), 0);
    // A refused token cannot be committed, and leaves the state as it was.
    assert!(c.commit(&tokens).is_err());
    assert!(c.commit(&[padding]).is_err());
    assert!(c.masks(&tokens).is_err());
    assert_eq!(mask_now(&mut c), before);
    c.commit(&prefix).expect("the allowed prefix commits");
    assert_eq!(c.validate(&tokens[prefix.len()..]).expect("validate"), 0);
}

#[test]
fn forced_tokens_spell_the_only_key_canonically() {
    let key = "customer_identifier";
    let spec = GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": { key: { "type": "string" } },
        "required": [key],
        "additionalProperties": false
    }));
    let mut c = compile(&spec);
    let prefix = encode(r#"{""#);
    let before = mask_now(&mut c);
    let forced = c.forced(&prefix, 64).expect("forced");
    let text = decode(&forced);
    eprintln!("forced after {:?}: {forced:?} = {text:?}", decode(&prefix));
    assert!(text.starts_with(key), "{text:?}");
    assert_eq!(encode(&text), forced, "canonical tokens of {text:?}");
    assert_eq!(mask_now(&mut c), before, "forced does not advance");
    let two = c.forced(&prefix, 2).expect("forced");
    assert_eq!(two, forced[..2]);
    // The forced tokens are what the masks allow, one by one.
    let mut all = prefix.clone();
    all.extend(&forced);
    let masks = c.masks(&all).expect("masks");
    for (i, &t) in forced.iter().enumerate() {
        assert_eq!(allowed_ids(&masks[prefix.len() + i]), vec![t]);
    }
    // Inside the string value there is a choice: nothing is forced.
    let mut value = prefix.clone();
    value.extend(encode(&format!(r#"{key}": "ab"#)));
    assert_eq!(c.validate(&value).expect("validate"), value.len());
    assert!(c.forced(&value, 64).expect("forced").is_empty());
}

#[test]
fn end_is_allowed_only_where_the_grammar_may_end() {
    let mut c = compile(&GrammarSpec::Regex("ab(cd)?".into()));
    let eos = gguf_tokenizer().eos_token_ids().clone();
    let first = mask_now(&mut c);
    check_mask(&first);
    assert!(!first.end_allowed);
    c.commit(&encode("ab")).expect("commit");
    let may_end = mask_now(&mut c);
    check_mask(&may_end);
    assert!(may_end.end_allowed, "ab is a match");
    assert!(may_end.count() > 0, "cd may follow");
    assert!(!c.is_complete());
    for &id in &eos {
        assert_eq!(c.validate(&[id]).expect("validate"), 0);
        assert!(c.commit(&[id]).is_err(), "EOS is never committed");
    }
    c.commit(&encode("cd")).expect("commit");
    assert!(c.is_complete());
    let end = mask_now(&mut c);
    assert!(end.end_allowed && end.count() == 0);
    assert_eq!(c.validate(&encode("x")).expect("validate"), 0);
    assert!(c.forced(&[], 8).expect("forced").is_empty());
    let mut with_eos = end.clone();
    for &id in &eos {
        with_eos.allow(id);
    }
    assert_eq!(
        with_eos.count(),
        eos.len(),
        "the loop's EOS ids are all that follow"
    );
}
