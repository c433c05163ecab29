//! Tokenizers built from small hand-written GGUF files: the parts of the
//! metadata the real model does not exercise, and malformed metadata.

use std::path::{Path, PathBuf};

use mlx_rs::io::{GgufFile, GgufMetadataValue};
use mlx_rs::Array;
use spec_text::{TextError, Tokenizer};

/// A byte-level vocabulary where `ab` and ` ab` are merged tokens.
const TOKENS: [&str; 8] = ["<s>", "</s>", "a", "b", "ab", "Ġ", "Ġab", "<think>"];
const MERGES: [&str; 2] = ["a b", "Ġ ab"];

fn strings(items: &[&str]) -> GgufMetadataValue {
    GgufMetadataValue::Strings(items.iter().map(|s| s.to_string()).collect())
}

/// The metadata of a small valid tokenizer; `edit` may change it.
fn base_metadata() -> Vec<(&'static str, GgufMetadataValue)> {
    vec![
        ("general.architecture", "llama".into()),
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.pre", "gpt-2".into()),
        ("tokenizer.ggml.tokens", strings(&TOKENS)),
        ("tokenizer.ggml.merges", strings(&MERGES)),
        (
            "tokenizer.ggml.token_type",
            Array::from_slice(&[3_i32, 3, 1, 1, 1, 1, 1, 4], &[8]).into(),
        ),
        (
            "tokenizer.ggml.bos_token_id",
            Array::from_slice(&[0_u32], &[1]).into(),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Array::from_slice(&[1_u32], &[1]).into(),
        ),
        (
            "tokenizer.ggml.eot_token_id",
            Array::from_slice(&[7_u32], &[1]).into(),
        ),
        (
            "tokenizer.ggml.add_bos_token",
            Array::from_bool(true).into(),
        ),
    ]
}

fn write_gguf(dir: &Path, metadata: Vec<(&'static str, GgufMetadataValue)>) -> PathBuf {
    let path = dir.join("tiny.gguf");
    let mut file = GgufFile::new().expect("new GGUF");
    file.insert_array("weight", &Array::from_slice(&[0.0_f32; 4], &[2, 2]))
        .expect("tensor");
    for (key, value) in metadata {
        file.insert_metadata(key, value).expect("metadata");
    }
    file.save(&path).expect("save GGUF");
    path
}

fn build(
    edit: impl FnOnce(&mut Vec<(&'static str, GgufMetadataValue)>),
) -> Result<Tokenizer, TextError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut metadata = base_metadata();
    edit(&mut metadata);
    Tokenizer::from_gguf(write_gguf(dir.path(), metadata))
}

fn without(key: &'static str) -> impl FnOnce(&mut Vec<(&'static str, GgufMetadataValue)>) {
    move |metadata| metadata.retain(|(k, _)| *k != key)
}

fn replacing(
    key: &'static str,
    value: GgufMetadataValue,
) -> impl FnOnce(&mut Vec<(&'static str, GgufMetadataValue)>) {
    move |metadata| {
        for entry in metadata.iter_mut().filter(|(k, _)| *k == key) {
            entry.1 = value.clone();
        }
    }
}

#[test]
fn small_vocabulary_merges_and_adds_bos() {
    let tok = build(|_| {}).expect("tokenizer");
    assert_eq!(tok.vocab_size(), 8);
    assert_eq!(tok.encode("ab ab", false).expect("encode"), [4, 6]);
    assert_eq!(
        tok.encode("ab ab", true).expect("encode"),
        [0, 4, 6],
        "add_bos_token prepends <s>"
    );
    assert_eq!(
        tok.encode("<s>ab</s>", false).expect("encode"),
        [0, 4, 1],
        "control tokens match whole"
    );
    assert_eq!(
        tok.encode("<think>ab", false).expect("encode"),
        [7, 4],
        "user-defined tokens match whole"
    );
    assert_eq!(tok.decode(&[0, 4, 6, 1], true).expect("decode"), "ab ab");
    assert_eq!(
        tok.decode(&[7, 4], true).expect("decode"),
        "<think>ab",
        "user-defined tokens are not special"
    );
    assert_eq!(tok.bos_token_id(), Some(0));
    assert_eq!(
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        [1, 7],
        "eos and eot end generation"
    );
    assert!(tok.chat_template_source().is_none());
    assert!(matches!(
        tok.chat_template(),
        Err(TextError::NoChatTemplate)
    ));
}

#[test]
fn without_add_bos_token_nothing_is_added() {
    let tok = build(without("tokenizer.ggml.add_bos_token")).expect("tokenizer");
    assert_eq!(tok.encode("ab", true).expect("encode"), [4]);
}

#[test]
fn gguf_without_tokenizer_metadata_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_gguf(dir.path(), vec![("general.architecture", "llama".into())]);
    let err = Tokenizer::from_gguf(&path).expect_err("no tokenizer");
    assert!(
        matches!(
            err,
            TextError::MissingGgufKey {
                key: "tokenizer.ggml.model",
                ..
            }
        ),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("no tokenizer metadata") && message.contains("tiny.gguf"),
        "{message}"
    );
}

#[test]
fn unsupported_tokenizer_model_is_named() {
    let err = build(replacing("tokenizer.ggml.model", "bert".into())).expect_err("WordPiece");
    assert!(
        matches!(&err, TextError::UnsupportedTokenizerModel { model, .. } if model == "bert"),
        "{err}"
    );
    assert!(err.to_string().contains("`bert`"), "{err}");
}

#[test]
fn unsupported_pre_tokenizer_is_named() {
    let err =
        build(replacing("tokenizer.ggml.pre", "falcon".into())).expect_err("unknown pre-tokenizer");
    assert!(
        matches!(&err, TextError::UnsupportedPreTokenizer { pre, .. } if pre == "falcon"),
        "{err}"
    );
    assert!(
        err.to_string().contains("qwen2"),
        "the supported names: {err}"
    );
}

#[test]
fn llama3_adds_bos_unless_the_file_says_otherwise() {
    // llama.cpp's default for the Llama 3 pre-tokenizer; the key overrides it.
    let llama3 = |edit: fn(&mut Vec<(&'static str, GgufMetadataValue)>)| {
        build(|m| {
            replacing("tokenizer.ggml.pre", "llama-bpe".into())(m);
            edit(m);
        })
        .expect("tokenizer")
    };
    let unsaid = llama3(|m| without("tokenizer.ggml.add_bos_token")(m));
    assert_eq!(unsaid.encode("ab", true).expect("encode"), [0, 4]);
    let refused = llama3(|m| {
        replacing(
            "tokenizer.ggml.add_bos_token",
            Array::from_bool(false).into(),
        )(m)
    });
    assert_eq!(refused.encode("ab", true).expect("encode"), [4]);
    let gpt2 = build(without("tokenizer.ggml.add_bos_token")).expect("tokenizer");
    assert_eq!(
        gpt2.encode("ab", true).expect("encode"),
        [4],
        "GPT-2's default"
    );
}

#[test]
fn qwen2_normalizes_to_nfc_and_qwen35_does_not() {
    // "a" + U+0301 (combining acute) composes to U+00E1 under NFC, which this
    // vocabulary lacks: NFC's text has other bytes than the decomposed one.
    let with = |pre: &'static str| {
        build(move |m| replacing("tokenizer.ggml.pre", pre.into())(m)).expect("tokenizer")
    };
    let decomposed = "a\u{301}";
    let composed = "\u{e1}";
    let qwen2 = with("qwen2");
    assert_eq!(
        qwen2.encode(decomposed, false).expect("encode"),
        qwen2.encode(composed, false).expect("encode")
    );
    let qwen35 = with("qwen35");
    assert_ne!(
        qwen35.encode(decomposed, false).expect("encode"),
        qwen35.encode(composed, false).expect("encode")
    );
}

#[test]
fn missing_merges_are_named() {
    let err = build(without("tokenizer.ggml.merges")).expect_err("no merges");
    assert!(
        matches!(
            err,
            TextError::MissingGgufKey {
                key: "tokenizer.ggml.merges",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn malformed_values_are_named() {
    let check = |key: &'static str, value: GgufMetadataValue| {
        let err = build(replacing(key, value)).expect_err(key);
        assert!(
            matches!(&err, TextError::BadGgufValue { key: k, .. } if *k == key),
            "{key}: {err}"
        );
    };
    check("tokenizer.ggml.merges", strings(&["ab"]));
    check(
        "tokenizer.ggml.token_type",
        Array::from_slice(&[1_i32, 1], &[2]).into(),
    );
    check(
        "tokenizer.ggml.eos_token_id",
        Array::from_slice(&[8_u32], &[1]).into(),
    );
    check("tokenizer.ggml.tokens", "not a list".into());
}

#[test]
fn wrong_typed_values_name_the_file_key_and_types() {
    let check = |key: &'static str, value: GgufMetadataValue, problem: &str| {
        let err = build(replacing(key, value)).expect_err(key);
        assert!(
            matches!(&err, TextError::BadGgufValue { key: k, problem: p, .. } if *k == key && p == problem),
            "{key}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("tiny.gguf") && message.contains(key),
            "{message}"
        );
    };
    check(
        "tokenizer.ggml.tokens",
        Array::from_int(5).into(),
        "is int32, expected an array of strings",
    );
    check(
        "tokenizer.ggml.bos_token_id",
        "0".into(),
        "is string, expected integers",
    );
    check(
        "tokenizer.ggml.token_type",
        Array::from_slice(&[1.0_f32; 8], &[8]).into(),
        "is an array of float32, expected integers",
    );
    check(
        "tokenizer.ggml.add_bos_token",
        Array::from_int(1).into(),
        "is int32, expected a bool",
    );
    check(
        "tokenizer.ggml.pre",
        Array::from_f32(1.5).into(),
        "is float32, expected a string",
    );
    let err = build_spm(|m| {
        replacing(
            "tokenizer.ggml.scores",
            Array::from_slice(&[0_i32; 10], &[10]).into(),
        )(m)
    })
    .expect_err("integer scores");
    assert!(
        err.to_string()
            .contains("is an array of int32, expected floats"),
        "{err}"
    );
}

#[test]
fn token_ids_of_any_integer_width_alone_or_in_an_array() {
    // llama.cpp writes ids as uint32 scalars; other writers use other widths.
    let tok = build(|m| {
        replacing("tokenizer.ggml.bos_token_id", Array::from_int(0).into())(m);
        replacing(
            "tokenizer.ggml.eos_token_id",
            Array::from_slice(&[1_u8], &[1]).into(),
        )(m);
    })
    .expect("tokenizer");
    assert_eq!(tok.bos_token_id(), Some(0));
    assert_eq!(
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        [1, 7]
    );
}

#[test]
fn a_path_that_is_not_a_gguf_file_is_named() {
    let err = Tokenizer::from_gguf("/nonexistent/model.gguf").expect_err("missing file");
    assert!(matches!(err, TextError::Gguf { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
}

/// A SentencePiece vocabulary (`llama`): pieces with scores, no merges;
/// `<0x21>` is the byte `!`, which no piece holds.
fn spm_metadata() -> Vec<(&'static str, GgufMetadataValue)> {
    let pieces = [
        "<unk>", "<s>", "</s>", "<0x21>", "▁", "a", "b", "ab", "▁ab", "▁a",
    ];
    let scores = [0.0_f32, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0];
    vec![
        ("general.architecture", "llama".into()),
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", strings(&pieces)),
        (
            "tokenizer.ggml.scores",
            Array::from_slice(&scores, &[10]).into(),
        ),
        (
            "tokenizer.ggml.token_type",
            Array::from_slice(&[2_i32, 3, 3, 6, 1, 1, 1, 1, 1, 1], &[10]).into(),
        ),
        (
            "tokenizer.ggml.bos_token_id",
            Array::from_slice(&[1_u32], &[1]).into(),
        ),
        (
            "tokenizer.ggml.unknown_token_id",
            Array::from_slice(&[0_u32], &[1]).into(),
        ),
    ]
}

fn build_spm(
    edit: impl FnOnce(&mut Vec<(&'static str, GgufMetadataValue)>),
) -> Result<Tokenizer, TextError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut metadata = spm_metadata();
    edit(&mut metadata);
    Tokenizer::from_gguf(write_gguf(dir.path(), metadata))
}

#[test]
fn sentencepiece_merges_follow_the_pieces_scores() {
    let tok = build_spm(|_| {}).expect("tokenizer");
    // "▁ab" (score -5) outranks "▁a" (-6): `▁ab` wins over `▁a` + `b`
    // because its merges `a b` (-4) and `▁ ab` (-5) both come first.
    assert_eq!(tok.encode("ab", false).expect("encode"), [8]);
    assert_eq!(
        tok.encode("ab", true).expect("encode"),
        [1, 8],
        "BOS by default"
    );
    // A space prefix and `▁` for spaces; `!` by byte fallback, `c` unknown.
    assert_eq!(tok.encode("a ab!c", false).expect("encode"), [9, 8, 3, 0]);
    assert_eq!(tok.decode(&[9, 8, 3], false).expect("decode"), "a ab!");
    let bare = build_spm(|m| {
        m.push((
            "tokenizer.ggml.add_space_prefix",
            Array::from_bool(false).into(),
        ))
    })
    .expect("tokenizer");
    assert_eq!(bare.encode("ab", false).expect("encode"), [7]);
}

#[test]
fn sentencepiece_scores_are_required_and_must_fit() {
    let err = build_spm(|m| without("tokenizer.ggml.scores")(m)).expect_err("no scores");
    assert!(
        matches!(
            err,
            TextError::MissingGgufKey {
                key: "tokenizer.ggml.scores",
                ..
            }
        ),
        "{err}"
    );
    let err = build_spm(|m| {
        replacing(
            "tokenizer.ggml.scores",
            Array::from_slice(&[0.0_f32; 3], &[3]).into(),
        )(m)
    })
    .expect_err("short scores");
    assert!(
        matches!(
            &err,
            TextError::BadGgufValue {
                key: "tokenizer.ggml.scores",
                ..
            }
        ),
        "{err}"
    );
}
