//! Building a tokenizer from the `tokenizer.*` metadata llama.cpp writes into
//! GGUF files: the vocabulary, merges, token types and special ids become the
//! same `tokenizers` pipeline Hugging Face uses for the model.

use std::collections::BTreeSet;
use std::path::Path;

use mlx_rs::io::{GgufError, GgufFile};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use crate::tokenizer::SpecialTokens;
use crate::{TextError, Tokenizer};

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const MERGES: &str = "tokenizer.ggml.merges";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// llama.cpp's token types that matter here.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The pre-tokenizer names (`tokenizer.ggml.pre`) that split digits one by one
/// before the GPT-2 regex; llama.cpp gives all of them the same rules.
const DIGIT_SPLITTING: &[&str] = &["starcoder", "refact", "command-r", "smollm", "codeshell"];
/// The names that use the GPT-2 regex alone.
const GPT2: &[&str] = &["default", "gpt-2"];

pub(crate) fn build(file: &GgufFile, path: &Path) -> Result<Tokenizer, TextError> {
    let meta = Metadata { file, path };
    let model = meta.string(MODEL)?.ok_or_else(|| meta.missing(MODEL))?;
    if model != "gpt2" {
        return Err(TextError::UnsupportedTokenizerModel {
            path: path.to_owned(),
            model,
        });
    }
    let pre_tokenizer = pre_tokenizer(meta.string(PRE)?.as_deref(), path)?;
    let tokens = meta.strings(TOKENS)?.ok_or_else(|| meta.missing(TOKENS))?;
    let merges = meta.strings(MERGES)?.ok_or_else(|| meta.missing(MERGES))?;
    let token_types = match meta.ints(TOKEN_TYPE)? {
        Some(types) if types.len() != tokens.len() => {
            return Err(meta.bad(
                TOKEN_TYPE,
                format!("has {} entries for {} tokens", types.len(), tokens.len()),
            ))
        }
        Some(types) => types,
        None => Vec::new(),
    };

    let vocab: Vocab = (0_u32..)
        .zip(&tokens)
        .map(|(id, token)| (token.clone(), id))
        .collect();
    let merges = merges
        .iter()
        .enumerate()
        .map(|(index, merge)| {
            merge
                .split_once(' ')
                .map(|(left, right)| (left.to_owned(), right.to_owned()))
                .ok_or_else(|| {
                    meta.bad(
                        MERGES,
                        format!("entry {index} ({merge:?}) is not two tokens separated by a space"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|source| TextError::Build { source })?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    // Control tokens (`<|im_start|>`) are matched whole and are special;
    // user-defined ones are matched whole too but decode as ordinary text.
    let of_type = |wanted: i64| {
        tokens
            .iter()
            .zip(&token_types)
            .filter(move |(_, &kind)| kind == wanted)
            .map(|(token, _)| token)
    };
    let control: Vec<_> = of_type(TOKEN_TYPE_CONTROL)
        .map(|t| AddedToken::from(t.clone(), true))
        .collect();
    let user: Vec<_> = of_type(TOKEN_TYPE_USER_DEFINED)
        .map(|t| AddedToken::from(t.clone(), false).normalized(false))
        .collect();
    inner.add_special_tokens(&control);
    inner.add_tokens(&user);

    let bos = meta.token(BOS_ID, &tokens)?;
    let eos = meta.token(EOS_ID, &tokens)?;
    if meta.flag(ADD_BOS)?.unwrap_or(false) {
        if let Some((id, text)) = &bos {
            let invalid = |message: String| TextError::Build {
                source: message.into(),
            };
            let mut template = TemplateProcessing::builder();
            template.try_single(format!("{text} $A")).map_err(invalid)?;
            template
                .try_pair(format!("{text} $A {text}:1 $B:1"))
                .map_err(invalid)?;
            template.special_tokens(vec![(text.clone(), *id)]);
            let template = template.build().map_err(|source| TextError::Build {
                source: source.into(),
            })?;
            inner.with_post_processor(Some(template));
        }
    }
    let mut eos_ids: BTreeSet<u32> = eos.iter().map(|(id, _)| *id).collect();
    for key in [EOT_ID, EOM_ID] {
        eos_ids.extend(meta.token(key, &tokens)?.map(|(id, _)| id));
    }
    let pad = meta.token(PAD_ID, &tokens)?.map(|(id, _)| id);
    let special = SpecialTokens {
        bos,
        eos,
        pad,
        eos_ids,
    };
    Ok(Tokenizer::new(inner, special, meta.string(CHAT_TEMPLATE)?))
}

fn pre_tokenizer(name: Option<&str>, path: &Path) -> Result<PreTokenizerWrapper, TextError> {
    // Files written before llama.cpp recorded the pre-tokenizer have no name;
    // like transformers, treat them as plain GPT-2.
    let name = name.unwrap_or("default");
    let byte_level = ByteLevel::new(false, true, true);
    if GPT2.contains(&name) {
        Ok(byte_level.into())
    } else if DIGIT_SPLITTING.contains(&name) {
        Ok(Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into())
    } else {
        Err(TextError::UnsupportedPreTokenizer {
            path: path.to_owned(),
            pre: name.to_owned(),
            supported: GPT2
                .iter()
                .chain(DIGIT_SPLITTING)
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// Typed reads of GGUF metadata whose errors name the file and key.
struct Metadata<'a> {
    file: &'a GgufFile,
    path: &'a Path,
}

impl Metadata<'_> {
    fn missing(&self, key: &'static str) -> TextError {
        TextError::MissingGgufKey {
            path: self.path.to_owned(),
            key,
        }
    }

    fn bad(&self, key: &'static str, problem: String) -> TextError {
        TextError::BadGgufValue {
            path: self.path.to_owned(),
            key,
            problem,
        }
    }

    fn value_error(
        &self,
        key: &'static str,
    ) -> impl Fn(mlx_rs::error::ConversionError) -> TextError + '_ {
        move |source| TextError::GgufValue {
            path: self.path.to_owned(),
            key,
            source,
        }
    }

    fn gguf_error(&self, key: &'static str) -> impl Fn(GgufError) -> TextError + '_ {
        move |error| match error {
            GgufError::WrongMetadataKind {
                expected, actual, ..
            } => self.bad(key, format!("is {actual:?}, expected {expected:?}")),
            source => TextError::Gguf {
                path: self.path.to_owned(),
                source,
            },
        }
    }

    fn string(&self, key: &'static str) -> Result<Option<String>, TextError> {
        self.file
            .get_metadata_string(key)
            .map_err(self.gguf_error(key))
    }

    fn strings(&self, key: &'static str) -> Result<Option<Vec<String>>, TextError> {
        self.file
            .get_metadata_strings(key)
            .map_err(self.gguf_error(key))
    }

    fn ints(&self, key: &'static str) -> Result<Option<Vec<i64>>, TextError> {
        let Some(array) = self
            .file
            .get_metadata_array(key)
            .map_err(self.gguf_error(key))?
        else {
            return Ok(None);
        };
        if array.dtype().is_float() || array.dtype() == mlx_rs::Dtype::Bool {
            return Err(self.bad(key, format!("is {:?}, expected integers", array.dtype())));
        }
        array
            .to_vec_cast::<i64>()
            .map(Some)
            .map_err(self.value_error(key))
    }

    fn flag(&self, key: &'static str) -> Result<Option<bool>, TextError> {
        let Some(array) = self
            .file
            .get_metadata_array(key)
            .map_err(self.gguf_error(key))?
        else {
            return Ok(None);
        };
        match array
            .to_vec_cast::<bool>()
            .map_err(self.value_error(key))?
            .as_slice()
        {
            [flag] => Ok(Some(*flag)),
            other => Err(self.bad(key, format!("has {} values, expected one", other.len()))),
        }
    }

    /// A token id and its text, checked against the vocabulary.
    fn token(
        &self,
        key: &'static str,
        tokens: &[String],
    ) -> Result<Option<(u32, String)>, TextError> {
        let Some(values) = self.ints(key)? else {
            return Ok(None);
        };
        let [id] = values.as_slice() else {
            return Err(self.bad(key, format!("has {} values, expected one", values.len())));
        };
        let text = usize::try_from(*id).ok().and_then(|i| tokens.get(i));
        match (u32::try_from(*id), text) {
            (Ok(id), Some(text)) => Ok(Some((id, text.clone()))),
            _ => Err(self.bad(
                key,
                format!("is {id}, outside the vocabulary of {}", tokens.len()),
            )),
        }
    }
}
