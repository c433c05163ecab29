//! Building a tokenizer from the `tokenizer.*` metadata llama.cpp writes into
//! GGUF files: the vocabulary, merges, token types and special ids become the
//! same `tokenizers` pipeline Hugging Face uses for the model.

use std::collections::BTreeSet;
use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split as SplitPre, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;
use tokenizers::SplitDelimiterBehavior;
use weights_guard::{GgufMetadata, GgufValue};

use crate::tokenizer::SpecialTokens;

mod spm;
use crate::{TextError, Tokenizer};

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const MERGES: &str = "tokenizer.ggml.merges";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const SCORES: &str = "tokenizer.ggml.scores";
const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// llama.cpp's token types that matter here.
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// How a family's text is split before BPE, by the name llama.cpp records
/// in `tokenizer.ggml.pre`: what the family's own `tokenizer.json` does
/// (llama.cpp's regexes are its adaptations of these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// GPT-2's byte-level regex alone.
    Gpt2,
    /// Digits one by one, then GPT-2's regex.
    Digits,
    /// Llama 3: numbers in runs of up to 3 digits; merges ignored where the
    /// vocabulary holds the whole piece.
    Llama3,
    /// Qwen2 / Qwen2.5 / Qwen3: NFC (their `tokenizer.json` and transformers'
    /// `Qwen2Tokenizer` normalize; llama.cpp's test texts do not tell), then
    /// numbers digit by digit.
    Qwen2,
    /// Qwen3.5: Qwen2's split with combining marks inside words, and no
    /// NFC (llama.cpp's tests of its tokenizer show decomposed text kept).
    Qwen35,
    /// DeepSeek LLM (7B, 67B): line breaks, then words of cased letters,
    /// then ASCII and full-width punctuation, trailing whitespace and CJK
    /// runs each isolated, digits one by one.
    DeepseekLlm,
    /// DeepSeek Coder (1.3B to 33B): line breaks, letters, punctuation and
    /// CJK runs isolated, digits one by one.
    DeepseekCoder,
}

/// `tokenizer.ggml.pre` -> the split it names, as llama.cpp maps the names
/// (`llama-vocab.cpp`), for the families whose Hugging Face tokenizer we
/// reproduce (checked against llama.cpp's own vocabulary tests: gate `gguf`).
const SPLITS: &[(&str, Split)] = &[
    ("default", Split::Gpt2),
    ("gpt-2", Split::Gpt2),
    ("starcoder", Split::Digits),
    ("refact", Split::Digits),
    ("command-r", Split::Digits),
    ("smollm", Split::Digits),
    ("codeshell", Split::Digits),
    ("llama3", Split::Llama3),
    ("llama-v3", Split::Llama3),
    ("llama-bpe", Split::Llama3),
    ("qwen2", Split::Qwen2),
    ("deepseek-r1-qwen", Split::Qwen2),
    ("qwen35", Split::Qwen35),
    ("deepseek-llm", Split::DeepseekLlm),
    ("deepseek-coder", Split::DeepseekCoder),
];

/// The Llama 3 / Qwen regexes, as their `tokenizer.json` files write them.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM's splits before its digits, as its `tokenizer.json` lists
/// them: each isolates what it matches, in order.
const DEEPSEEK_LLM_SPLITS: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
];

/// DeepSeek Coder's, the same way.
const DEEPSEEK_CODER_SPLITS: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
];

impl Split {
    fn named(name: Option<&str>, path: &Path) -> Result<Self, TextError> {
        // Files written before llama.cpp recorded the pre-tokenizer have no
        // name; like transformers, treat them as plain GPT-2.
        let name = name.unwrap_or("default");
        SPLITS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, split)| *split)
            .ok_or_else(|| TextError::UnsupportedPreTokenizer {
                path: path.to_owned(),
                pre: name.to_owned(),
                supported: SPLITS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper, TextError> {
        let regex = match self {
            Self::Gpt2 => return Ok(ByteLevel::new(false, true, true).into()),
            Self::Digits => {
                return Ok(Sequence::new(vec![
                    Digits::new(true).into(),
                    ByteLevel::new(false, true, true).into(),
                ])
                .into())
            }
            Self::Llama3 => LLAMA3_REGEX,
            Self::Qwen2 => QWEN2_REGEX,
            Self::Qwen35 => QWEN35_REGEX,
            Self::DeepseekLlm => return isolating(DEEPSEEK_LLM_SPLITS),
            Self::DeepseekCoder => return isolating(DEEPSEEK_CODER_SPLITS),
        };
        let split = SplitPre::new(
            SplitPattern::Regex(regex.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|source| TextError::Build { source })?;
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, true, false).into(),
        ])
        .into())
    }

    fn normalizer(self) -> Option<NormalizerWrapper> {
        (self == Self::Qwen2).then(|| NFC.into())
    }

    /// Whether a piece found whole in the vocabulary skips the merges.
    fn ignores_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Whether BOS is added when the file does not say (llama.cpp's default).
    fn adds_bos(self) -> bool {
        self == Self::Llama3
    }
}

pub(crate) fn build(values: &GgufMetadata, path: &Path) -> Result<Tokenizer, TextError> {
    let meta = Metadata { values, path };
    let model = meta.string(MODEL)?.ok_or_else(|| meta.missing(MODEL))?;
    if model != "gpt2" && model != "llama" {
        return Err(TextError::UnsupportedTokenizerModel {
            path: path.to_owned(),
            model,
        });
    }
    let tokens = meta.strings(TOKENS)?.ok_or_else(|| meta.missing(TOKENS))?;
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
    let (mut inner, bos_by_default) = if model == "llama" {
        // llama.cpp adds BOS to SentencePiece vocabularies unless told not to.
        (spm::build(&meta, &tokens, &token_types)?, true)
    } else {
        let split = Split::named(meta.string(PRE)?.as_deref(), path)?;
        (byte_level(&meta, &tokens, split)?, split.adds_bos())
    };
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
    if meta.flag(ADD_BOS)?.unwrap_or(bos_by_default) {
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

/// A byte-level BPE (`gpt2`): the merges as stored, the text split as
/// `split` says.
fn byte_level(
    meta: &Metadata,
    tokens: &[String],
    split: Split,
) -> Result<tokenizers::Tokenizer, TextError> {
    let merges = meta.strings(MERGES)?.ok_or_else(|| meta.missing(MERGES))?;
    let vocab: Vocab = (0_u32..)
        .zip(tokens)
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
        .ignore_merges(split.ignores_merges())
        .build()
        .map_err(|source| TextError::Build { source })?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_normalizer(split.normalizer());
    inner.with_pre_tokenizer(Some(split.pre_tokenizer()?));
    inner.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    Ok(inner)
}

/// Each regex of `splits` isolating its matches in turn, then digits one by
/// one, then bytes as GPT-2 maps them (no regex of its own): DeepSeek's
/// `tokenizer.json` pre-tokenizer.
fn isolating(splits: &[&str]) -> Result<PreTokenizerWrapper, TextError> {
    let mut steps = Vec::new();
    for regex in splits {
        let split = SplitPre::new(
            SplitPattern::Regex((*regex).to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|source| TextError::Build { source })?;
        steps.push(split.into());
    }
    steps.push(Digits::new(true).into());
    steps.push(ByteLevel::new(false, true, false).into());
    Ok(Sequence::new(steps).into())
}

/// Typed reads of GGUF metadata whose errors name the file and key.
struct Metadata<'a> {
    values: &'a GgufMetadata,
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

    /// The error for a value of the wrong kind: "is float32, expected a
    /// string".
    fn wrong_kind(&self, key: &'static str, value: &GgufValue, expected: &str) -> TextError {
        self.bad(key, format!("is {}, expected {expected}", describe(value)))
    }

    fn string(&self, key: &'static str) -> Result<Option<String>, TextError> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        value
            .as_str()
            .map(|text| Some(text.to_owned()))
            .ok_or_else(|| self.wrong_kind(key, value, "a string"))
    }

    fn strings(&self, key: &'static str) -> Result<Option<Vec<String>>, TextError> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        value
            .as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(|item| item.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
            })
            .map(Some)
            .ok_or_else(|| self.wrong_kind(key, value, "an array of strings"))
    }

    /// The numbers of an array, or of a single value (as MLX's reader gave
    /// them, a scalar is an array of one), each read by `read`.
    fn numbers<T>(
        &self,
        key: &'static str,
        expected: &str,
        read: impl Fn(&GgufValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>, TextError> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        let items = value.as_array().unwrap_or(std::slice::from_ref(value));
        // GGUF arrays hold one type: one wrong item makes the whole value
        // the wrong kind.
        items
            .iter()
            .map(|item| {
                read(item).ok_or_else(|| match item {
                    // The only integer `as_i64` refuses.
                    GgufValue::U64(big) => {
                        self.bad(key, format!("holds {big}, too large for int64"))
                    }
                    _ => self.wrong_kind(key, value, expected),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Integers of any width.
    fn ints(&self, key: &'static str) -> Result<Option<Vec<i64>>, TextError> {
        self.numbers(key, "integers", GgufValue::as_i64)
    }

    /// `float32` (or `float64`) values.
    fn floats(&self, key: &'static str) -> Result<Option<Vec<f32>>, TextError> {
        self.numbers(key, "floats", |item| match *item {
            GgufValue::F32(v) => Some(v),
            // Scores only rank pieces: float32's precision is plenty.
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        })
    }

    /// A bool, stored alone or as an array of one.
    fn flag(&self, key: &'static str) -> Result<Option<bool>, TextError> {
        let Some(flags) = self.numbers(key, "a bool", GgufValue::as_bool)? else {
            return Ok(None);
        };
        match flags.as_slice() {
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

/// A value's kind as errors name it: `float32`, `an array of int32`.
fn describe(value: &GgufValue) -> String {
    match value.as_array() {
        Some([]) => "an empty array".to_owned(),
        Some([first, ..]) => format!("an array of {}", first.type_name()),
        None => value.type_name().to_owned(),
    }
}
