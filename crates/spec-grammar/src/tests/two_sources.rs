//! The token environment is the same whether the vocabulary comes from GGUF
//! metadata or from a `tokenizer.json`.

use serde_json::json;

use super::*;

/// The masks along `tokens` under a JSON schema, and the forced tokens
/// after each prefix, from `env`.
fn masks_from(env: &TokenEnv, tokens: &[u32]) -> (Vec<TokenMask>, Vec<Vec<u32>>) {
    let spec = GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": { "city": { "type": "string" }, "zip": { "type": "integer" } },
        "required": ["city", "zip"]
    }));
    let mut c = env.constraint(&spec).expect("compiles");
    let masks = c.masks(tokens).expect("masks");
    let forced: Vec<Vec<u32>> = (0..=tokens.len())
        .map(|n| c.forced(&tokens[..n], 16).expect("forced"))
        .collect();
    assert!(forced.iter().any(|f| !f.is_empty()), "something is forced");
    (masks, forced)
}

#[test]
fn gguf_and_tokenizer_json_give_the_same_masks() {
    let gguf = gguf_tokenizer();
    let vocab = gguf.vocab_size();
    let tokens = encode(r#"{"city": "Zürich 8001", "zip": 8001}"#);
    let expected = masks_from(&TokenEnv::new(gguf.clone(), vocab).expect("env"), &tokens);

    let dir = tempfile::tempdir().expect("tempdir");
    gguf.save_hf_files(dir.path()).expect("save");
    let written = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("load");
    assert_eq!(
        written.encode(PERSONISH, false).expect("encode"),
        encode(PERSONISH)
    );
    let env = TokenEnv::new(Arc::new(written), vocab).expect("env");
    assert_eq!(
        masks_from(&env, &tokens),
        expected,
        "written tokenizer.json"
    );

    if let Some(path) = gate_tokenizer_json() {
        let gate = Tokenizer::from_file(&path).expect("gate tokenizer");
        assert_eq!(gate.vocab_size(), vocab);
        let env = TokenEnv::new(Arc::new(gate), vocab).expect("env");
        assert_eq!(masks_from(&env, &tokens), expected, "{}", path.display());
    }
}

const PERSONISH: &str = "{\"name\": \"Zoë\"}";

#[test]
fn a_model_narrower_than_the_tokenizer_is_refused() {
    let gguf = gguf_tokenizer();
    let err = TokenEnv::new(gguf.clone(), gguf.vocab_size() - 1).expect_err("narrow");
    assert!(err.to_string().contains("more than the model"), "{err}");
}
