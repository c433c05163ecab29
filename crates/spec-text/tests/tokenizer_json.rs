//! Loading Hugging Face tokenizer files that are broken.

use spec_text::{TextError, Tokenizer};

#[test]
fn tokenizer_json_that_is_not_json_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, "this is not JSON").expect("write");
    let err = Tokenizer::from_file(&path).expect_err("not JSON");
    assert!(matches!(err, TextError::TokenizerFile { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn missing_tokenizer_json_names_the_file() {
    let err = Tokenizer::from_file("/nonexistent/tokenizer.json").expect_err("missing");
    assert!(
        err.to_string().contains("/nonexistent/tokenizer.json"),
        "{err}"
    );
}
