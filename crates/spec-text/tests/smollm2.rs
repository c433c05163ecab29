//! The tokenizer and chat template of the real default model, SmolLM2-135M-
//! Instruct, built from its GGUF metadata (fetched once by `spec-hub`).

use std::sync::OnceLock;

use spec_text::{Message, TextError, Tokenizer};

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = spec_hub::default_model().expect("default model");
        Tokenizer::from_gguf(&path).expect("tokenizer from GGUF metadata")
    })
}

const MULTILINGUAL: &str = "In 2024 the café served 3 crêpes: 日本語 и русский 😀!";

#[test]
fn vocabulary_and_special_tokens() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    tok.check_vocab(49152)
        .expect("the model's own vocabulary fits");
    tok.check_vocab(50000).expect("a padded embedding fits");
    let err = tok
        .check_vocab(32000)
        .expect_err("a smaller embedding does not");
    assert!(
        matches!(
            err,
            TextError::VocabMismatch {
                tokenizer: 49152,
                model: 32000
            }
        ),
        "{err}"
    );

    let im_end = tok
        .token_to_id("<|im_end|>")
        .expect("<|im_end|> in vocabulary");
    assert_eq!(im_end, 2, "tokenizer.ggml.eos_token_id");
    assert!(tok.eos_token_ids().contains(&im_end));
    assert!(tok.is_eos(im_end));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.special_token_id("<|im_end|>"), Some(im_end));
    assert_eq!(tok.special_token_id("hello"), None, "ordinary text");
    assert_eq!(tok.special_token_id("<|im_end"), None, "not a whole token");
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(
        tok.pad_token_id(),
        Some(2),
        "tokenizer.ggml.padding_token_id"
    );
    assert_eq!(tok.id_to_token(4649).as_deref(), Some("ĠFrance"));
    assert_eq!(tok.id_to_token(49152), None);
}

/// Golden ids from llama.cpp's own tokenizer on the same GGUF file, produced
/// with llama-cpp-python 0.3.36 (built from source by pip) in a throwaway venv:
///
/// ```text
/// python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install llama-cpp-python==0.3.36
/// /tmp/tokvenv/bin/python -c 'import sys; from llama_cpp import Llama
/// llm = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
/// for t in sys.argv[2:]: print(repr(t), llm.tokenize(t.encode(), add_bos=False, special=True))' \
///     ~/.cache/mlx-spec/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf TEXT...
/// ```
///
/// The Python `tokenizers` 0.23.3 package, given the GGUF vocabulary and merges
/// (read with `gguf` 0.19.0) in the shape of SmolLM2's `tokenizer.json`
/// (Digits + ByteLevel pre-tokenizer, control tokens special), gives the same ids.
#[test]
fn encodes_like_the_reference_tokenizers() {
    fn check(text: &str, expected: &[u32]) {
        let ids = tokenizer().encode(text, false).expect("encode");
        assert_eq!(ids, expected, "{text:?}");
        // SmolLM2 adds no BOS (`tokenizer.ggml.add_bos_token` is false).
        assert_eq!(
            tokenizer().encode(text, true).expect("encode"),
            expected,
            "{text:?} with special tokens"
        );
    }
    check(
        "What is the capital of France?",
        &[1780, 314, 260, 3575, 282, 4649, 47],
    );
    check(
        MULTILINGUAL,
        &[
            788, 216, 34, 32, 34, 36, 260, 37366, 5019, 216, 35, 1650, 22069, 3030, 42, 17097, 241,
            115, 40993, 179, 120, 248, 29972, 216, 9175, 14714, 9382, 39511, 7872, 24958, 40303,
            218, 17,
        ],
    );
    check("<|im_start|>user\nHi<|im_end|>", &[1, 4093, 198, 26843, 2]);
    check(
        "  two  spaces\n\ttab  ",
        &[216, 827, 216, 5600, 198, 197, 15999, 256],
    );
    check("😀", &[10813, 242, 218]);
}

#[test]
fn decode_round_trips() {
    let tok = tokenizer();
    for text in [
        "What is the capital of France?",
        MULTILINGUAL,
        "  two  spaces\n\ttab  ",
    ] {
        let ids = tok.encode(text, false).expect("encode");
        assert_eq!(tok.decode(&ids, false).expect("decode"), text);
    }
    let ids = tok
        .encode("<|im_start|>user\nHi<|im_end|>", false)
        .expect("encode");
    assert_eq!(
        tok.decode(&ids, true).expect("decode"),
        "user\nHi",
        "special tokens skipped"
    );
    let err = tok
        .decode(&[1780, 49152], false)
        .expect_err("id past the vocabulary");
    assert!(
        matches!(
            err,
            TextError::UnknownTokenId {
                id: 49152,
                vocab_size: 49152
            }
        ),
        "{err}"
    );
}

#[test]
fn stream_decoder_output_concatenates_to_decode() {
    let tok = tokenizer();
    let ids = tok.encode(MULTILINGUAL, false).expect("encode");
    let mut stream = tok.stream_decoder(false);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(stream.step(id).expect("step"));
    }
    pieces.push(stream.finish().expect("finish"));
    assert_eq!(pieces.concat(), tok.decode(&ids, false).expect("decode"));
    assert_eq!(pieces.concat(), MULTILINGUAL);
    assert!(
        pieces
            .iter()
            .all(|p| !p.contains(char::REPLACEMENT_CHARACTER)),
        "{pieces:?}"
    );
    // 日本語 and the emoji span several byte-level tokens: some steps wait.
    assert!(
        pieces[..ids.len()].iter().any(String::is_empty),
        "{pieces:?}"
    );
}

#[test]
fn stream_decoder_skips_special_tokens_like_decode() {
    let tok = tokenizer();
    let text = "<|im_start|>user\nCafé ☕ 😀<|im_end|>\n<|im_start|>assistant\n";
    let ids = tok.encode(text, false).expect("encode");
    for skip in [false, true] {
        let mut stream = tok.stream_decoder(skip);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.step(id).expect("step"));
        }
        out.push_str(&stream.finish().expect("finish"));
        assert_eq!(
            out,
            tok.decode(&ids, skip).expect("decode"),
            "skip_special_tokens={skip}"
        );
    }
}

#[test]
fn stream_decoder_flushes_an_incomplete_character_at_the_end() {
    let tok = tokenizer();
    let ids = tok.encode("😀", false).expect("encode");
    assert!(ids.len() > 1, "the emoji is several byte tokens: {ids:?}");
    let partial = &ids[..ids.len() - 1];
    let mut stream = tok.stream_decoder(false);
    let mut out = String::new();
    for &id in partial {
        out.push_str(&stream.step(id).expect("step"));
    }
    assert_eq!(out, "", "nothing complete yet");
    out.push_str(&stream.finish().expect("finish"));
    assert_eq!(out, tok.decode(partial, false).expect("decode"));
    assert!(out.ends_with(char::REPLACEMENT_CHARACTER));
}

/// Expected prompts rendered by Jinja2 3.1.6 as transformers configures it
/// (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
/// extensions=["jinja2.ext.loopcontrols"])`) from the GGUF's template.
#[test]
fn chat_template_renders_like_transformers() {
    let template = tokenizer().chat_template().expect("template");
    let prompt = template
        .render(&[Message::user("What is the capital of France?")], true)
        .expect("render");
    assert!(
        prompt.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );

    let conversation = [
        Message::system("Be brief."),
        Message::user("Hi"),
        Message::assistant("Hello!"),
        Message::user("2+2?"),
    ];
    assert_eq!(
        template.render(&conversation, true).expect("render"),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let without_prompt = template.render(&conversation, false).expect("render");
    assert!(
        without_prompt.ends_with("2+2?<|im_end|>\n"),
        "{without_prompt}"
    );
}

#[test]
fn rendered_prompt_tokenizes_turn_markers_as_single_ids() {
    let tok = tokenizer();
    let prompt = tok
        .chat_template()
        .expect("template")
        .render(&[Message::user("Hi")], true)
        .expect("render");
    let ids = tok.encode(&prompt, false).expect("encode");
    assert_eq!(
        ids.iter().filter(|&&id| id == 1).count(),
        3,
        "three <|im_start|>: {ids:?}"
    );
    assert_eq!(
        ids.iter().filter(|&&id| id == 2).count(),
        2,
        "two <|im_end|>: {ids:?}"
    );
    assert_eq!(
        &ids[ids.len() - 4..],
        &[1, 520, 9531, 198],
        "ends with <|im_start|>assistant\\n"
    );
}
