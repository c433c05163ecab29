//! The tokenizer: text to ids and back, with the special tokens a model and its
//! chat template need.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;

use crate::{ChatTemplate, StreamDecoder, TextError};

/// A tokenizer with its special tokens and chat template, loaded from a
/// Hugging Face `tokenizer.json` ([`Tokenizer::from_file`]) or built from the
/// metadata of a GGUF file ([`Tokenizer::from_gguf`]).
pub struct Tokenizer {
    pub(crate) inner: tokenizers::Tokenizer,
    pub(crate) special: SpecialTokens,
    pub(crate) chat_template: Option<String>,
    /// One past the largest id, which is what a model's embedding must cover.
    pub(crate) vocab_size: usize,
    /// The added tokens marked special, by text (grammars look them up often).
    special_ids: HashMap<String, u32>,
}

/// The special tokens a loader found, before they are checked against the
/// vocabulary.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialTokens {
    pub bos: Option<(u32, String)>,
    pub eos: Option<(u32, String)>,
    pub pad: Option<u32>,
    /// Every id that ends generation: the eos id plus any others the files name.
    pub eos_ids: BTreeSet<u32>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.special.bos)
            .field("eos", &self.special.eos)
            .field("eos_ids", &self.special.eos_ids)
            .field("chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    pub(crate) fn new(
        inner: tokenizers::Tokenizer,
        special: SpecialTokens,
        chat_template: Option<String>,
    ) -> Self {
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&max| max as usize + 1);
        let special_ids = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, token)| (token.content, id))
            .collect();
        Self {
            inner,
            special,
            chat_template,
            vocab_size,
            special_ids,
        }
    }

    /// Loads a Hugging Face `tokenizer.json`, with the special tokens and chat
    /// template from `tokenizer_config.json` (or `chat_template.jinja`) and the
    /// end-of-sequence ids from `generation_config.json` when those files sit
    /// beside it.
    pub fn from_file(tokenizer_json: impl AsRef<Path>) -> Result<Self, TextError> {
        crate::hf_files::load(tokenizer_json.as_ref())
    }

    /// Builds the tokenizer a GGUF file describes in its `tokenizer.*` metadata.
    /// Only the header is read (by weights-guard, which validates it): no
    /// tensor is loaded.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Self, TextError> {
        let path = path.as_ref();
        let (_, metadata) = weights_guard::read_gguf(path, &weights_guard::Limits::default())
            .map_err(|source| TextError::Gguf {
                path: path.to_owned(),
                source: Box::new(source),
            })?;
        Self::from_gguf_metadata(&metadata, path)
    }

    /// Builds the tokenizer from GGUF metadata already read with
    /// [`weights_guard::read_gguf`]; `path` only names the file in errors.
    pub fn from_gguf_metadata(
        metadata: &weights_guard::GgufMetadata,
        path: impl AsRef<Path>,
    ) -> Result<Self, TextError> {
        crate::gguf::build(metadata, path.as_ref())
    }

    /// The tokenizer as Hugging Face `tokenizer.json` text (for a GGUF-built
    /// tokenizer, the one assembled from its metadata): what other libraries
    /// read a vocabulary from.
    pub fn to_json(&self) -> Result<String, TextError> {
        self.inner
            .to_string(false)
            .map_err(|source| TextError::Serialize { source })
    }

    /// The ids of `text`; with `add_special_tokens` the post-processor adds
    /// what the model expects around a sequence (e.g. BOS), if anything.
    /// Special tokens written in `text` (such as `<|im_start|>`) become their ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|source| TextError::Encode { source })
    }

    /// The text of `ids`, leaving out special tokens if `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        // The tokenizers library skips unknown ids silently; an id past the
        // vocabulary means a model and tokenizer that do not belong together.
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TextError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|source| TextError::Decode { source })
    }

    /// A detokenizer that takes ids one at a time and returns the text each
    /// completes.
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special_tokens)
    }

    /// The ids that end generation.
    pub fn eos_token_ids(&self) -> &BTreeSet<u32> {
        &self.special.eos_ids
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.special.eos_ids.contains(&id)
    }

    /// The beginning-of-sequence id, if the tokenizer has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.special.bos.as_ref().map(|(id, _)| *id)
    }

    /// The padding id, if the tokenizer names one.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.special.pad
    }

    /// The beginning-of-sequence token's text, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.special.bos.as_ref().map(|(_, text)| text.as_str())
    }

    /// The (primary) end-of-sequence token's text, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.special.eos.as_ref().map(|(_, text)| text.as_str())
    }

    /// One past the largest token id: the number of embedding rows a model
    /// needs for this tokenizer.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The token (in the vocabulary's spelling, e.g. `Ġthe`) of `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of `token` (in the vocabulary's spelling).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The id of `text` when it is one special token (an added token marked
    /// special, such as `<|im_end|>` or `[TOOL_CALLS]`): the tokens a grammar
    /// must name by id, since their bytes are not their text. `None` for
    /// ordinary text, including added tokens that are not special (Qwen's
    /// `<think>`).
    pub fn special_token_id(&self, text: &str) -> Option<u32> {
        self.special_ids.get(text).copied()
    }

    /// Checks that every id this tokenizer produces has a row in a model
    /// embedding of `model_vocab_size` rows. A smaller tokenizer is fine:
    /// models often pad their embedding past the vocabulary.
    pub fn check_vocab(&self, model_vocab_size: usize) -> Result<(), TextError> {
        if self.vocab_size > model_vocab_size {
            return Err(TextError::VocabMismatch {
                tokenizer: self.vocab_size,
                model: model_vocab_size,
            });
        }
        Ok(())
    }

    /// The chat template's source, if the tokenizer carries one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The tokenizer's chat template, compiled, with its BOS and EOS tokens.
    pub fn chat_template(&self) -> Result<ChatTemplate, TextError> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or(TextError::NoChatTemplate)?;
        ChatTemplate::new(source, self.bos_token(), self.eos_token())
    }
}
