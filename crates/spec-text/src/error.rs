//! The crate's error type.

use std::path::PathBuf;

/// Why text could not be tokenized, detokenized or templated.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The tokenizers library could not write a tokenizer file.
    #[error("writing {path}: {source}")]
    WriteTokenizer {
        /// The file.
        path: PathBuf,
        /// What the tokenizers library reported.
        source: tokenizers::Error,
    },

    /// A `tokenizer.json` could not be loaded.
    #[error("loading tokenizer {path}: {source}")]
    TokenizerFile {
        /// The `tokenizer.json` file.
        path: PathBuf,
        /// What the tokenizers library reported.
        source: tokenizers::Error,
    },

    /// A JSON configuration file beside `tokenizer.json` is malformed.
    #[error("parsing {path}: {source}")]
    ConfigFile {
        /// The configuration file.
        path: PathBuf,
        /// What the JSON parser reported.
        source: serde_json::Error,
    },

    /// A GGUF file could not be read, or its header failed validation
    /// (weights-guard reads the metadata; no tensor is loaded).
    #[error("reading GGUF metadata: {source}")]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// What weights-guard reported (it names the file too).
        #[source]
        source: Box<weights_guard::GuardError>,
    },

    /// A GGUF file lacks metadata the tokenizer needs.
    #[error("GGUF file {path} has no tokenizer metadata: key `{key}` is missing")]
    MissingGgufKey {
        /// The GGUF file.
        path: PathBuf,
        /// The missing metadata key.
        key: &'static str,
    },

    /// A GGUF metadata value has the wrong type or an impossible value.
    #[error("GGUF file {path}: metadata `{key}` {problem}")]
    BadGgufValue {
        /// The GGUF file.
        path: PathBuf,
        /// The metadata key.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },

    /// The GGUF names a tokenizer model this crate cannot build.
    #[error("GGUF file {path}: unsupported tokenizer model `{model}` (supported: `gpt2`, byte-level BPE; `llama`, SentencePiece BPE)")]
    UnsupportedTokenizerModel {
        /// The GGUF file.
        path: PathBuf,
        /// The value of `tokenizer.ggml.model`.
        model: String,
    },

    /// The GGUF names a pre-tokenizer this crate does not know.
    #[error("GGUF file {path}: unsupported pre-tokenizer `{pre}` (supported: {supported})")]
    UnsupportedPreTokenizer {
        /// The GGUF file.
        path: PathBuf,
        /// The value of `tokenizer.ggml.pre`.
        pre: String,
        /// The names that are supported.
        supported: String,
    },

    /// The tokenizers library rejected the tokenizer assembled from metadata.
    #[error("building the tokenizer: {source}")]
    Build {
        /// What the tokenizers library reported.
        source: tokenizers::Error,
    },

    /// Encoding text failed.
    #[error("encoding text: {source}")]
    Encode {
        /// What the tokenizers library reported.
        source: tokenizers::Error,
    },

    /// Decoding ids failed.
    #[error("decoding ids: {source}")]
    Decode {
        /// What the tokenizers library reported.
        source: tokenizers::Error,
    },

    /// The tokenizers library could not write a tokenizer as JSON.
    #[error("writing the tokenizer as JSON: {source}")]
    Serialize {
        /// The library's error.
        source: tokenizers::Error,
    },

    /// A token id is outside the tokenizer's vocabulary.
    #[error("token id {id} is outside the tokenizer's vocabulary of {vocab_size}")]
    UnknownTokenId {
        /// The id.
        id: u32,
        /// The tokenizer's vocabulary size.
        vocab_size: usize,
    },

    /// The streaming detokenizer saw decoded text change behind what it had
    /// already emitted, which only happens with decoders that rewrite earlier
    /// text when more ids follow.
    #[error(
        "streaming detokenization: decoding more ids changed already emitted text {emitted:?}"
    )]
    UnstableDecode {
        /// The text that had been emitted and was then decoded differently.
        emitted: String,
    },

    /// The tokenizer has more tokens than the model has embedding rows.
    #[error("tokenizer vocabulary ({tokenizer}) is larger than the model's ({model}): ids past {model} have no embedding")]
    VocabMismatch {
        /// The tokenizer's vocabulary size.
        tokenizer: usize,
        /// The model's vocabulary size (embedding rows).
        model: usize,
    },

    /// The tokenizer carries no chat template.
    #[error("the tokenizer has no chat template")]
    NoChatTemplate,

    /// The chat template does not compile.
    #[error("compiling the chat template: {source}")]
    TemplateSyntax {
        /// What the template engine reported.
        source: minijinja::Error,
    },

    /// The template drops part of the message to continue
    /// (`render_continuing`), as transformers refuses it.
    #[error("the chat template does not keep the final message intact, so it cannot be continued: {message:?}")]
    ContinueFinalMessage {
        /// The final message's text.
        message: String,
    },

    /// The chat template ran past its step limit (`TEMPLATE_FUEL`
    /// instructions): a runaway loop, refused rather than run forever.
    #[error("the chat template ran past its limit of {limit} steps (a loop that does not end, or one far too long for these messages)")]
    TemplateFuel {
        /// The steps a render may take.
        limit: u64,
    },

    /// Rendering the chat template failed, e.g. through `raise_exception`.
    #[error("rendering the chat template: {source}")]
    TemplateRender {
        /// What the template engine reported, including the raised message.
        source: minijinja::Error,
    },
}
