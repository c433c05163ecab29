//! The vocabulary as llguidance sees it, built once per model: every token's
//! bytes in a trie, tokenization through the model's own tokenizer, and the
//! parser factory that compiles requests' grammars.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::api::ParserLimits;
use llguidance::{Matcher, ParserFactory};
use spec_text::Tokenizer;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::{GrammarConstraint, GrammarError, GrammarKind, GrammarSpec};

/// Bounds on compiling a grammar, so a hostile or careless request costs an
/// error rather than a hang or an unbounded allocation.
#[derive(Debug, Clone)]
pub struct GrammarLimits {
    /// The largest grammar source accepted, in bytes (a JSON schema as
    /// compact JSON, a Lark grammar or regex as written). Default 1 MiB.
    pub max_source_bytes: usize,
    /// llguidance's own bounds, checked while compiling and per mask:
    /// lexer fuel for building the lexer (default 1,000,000, about 20 ms),
    /// grammar size in symbols (500,000), lexer states (250,000), and the
    /// lexer fuel and Earley items one mask may spend (200,000; 50,000).
    /// Errors leave out the parser state (`verbose_errors` off). A JSON
    /// schema is also bounded by llguidance itself at 50,000 subschemas.
    /// Within these bounds compiling still takes time: a 500 kB Lark
    /// grammar of 60,000 alternatives took 3.5 s here, so compile off the
    /// engine's thread.
    pub parser: ParserLimits,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        Self {
            max_source_bytes: 1 << 20,
            parser: ParserLimits {
                verbose_errors: false,
                ..ParserLimits::default()
            },
        }
    }
}

/// A model's vocabulary prepared for constrained decoding, built once per
/// model and shared by its requests' constraints.
pub struct TokenEnv {
    factory: ParserFactory,
    eos_ids: Vec<u32>,
    vocab_size: usize,
    max_source_bytes: usize,
}

impl fmt::Debug for TokenEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenEnv")
            .field("vocab_size", &self.vocab_size)
            .field("eos_ids", &self.eos_ids)
            .field("max_source_bytes", &self.max_source_bytes)
            .field("limits", self.factory.limits())
            .finish_non_exhaustive()
    }
}

/// toktrie's view of our tokenizer: the trie of token bytes, and
/// tokenization through the tokenizer itself.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Valid UTF-8 through the tokenizer (as the model saw text in
    /// training); anything else, or text the tokenizer fails on, by the
    /// trie's greedy tokenization.
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(bytes, |text| {
            match self.tokenizer.encode(text, false) {
                Ok(ids) => ids,
                Err(err) => {
                    tracing::warn!("tokenizing grammar text {text:?}: {err}; using greedy tokens");
                    self.trie.greedy_tokenize(text.as_bytes())
                }
            }
        })
    }
}

impl TokenEnv {
    /// Prepares `tokenizer`'s vocabulary for a model whose logits are
    /// `model_vocab_size` wide (ids past the tokenizer's vocabulary are
    /// never allowed), with the default [`GrammarLimits`].
    pub fn new(tokenizer: Arc<Tokenizer>, model_vocab_size: usize) -> Result<Self, GrammarError> {
        Self::with_limits(tokenizer, model_vocab_size, GrammarLimits::default())
    }

    /// [`TokenEnv::new`] with explicit limits.
    pub fn with_limits(
        tokenizer: Arc<Tokenizer>,
        model_vocab_size: usize,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        let json = tokenizer.to_json().map_err(GrammarError::Tokenizer)?;
        let json: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| GrammarError::Vocabulary(format!("tokenizer JSON: {e}")))?;
        // llguidance asserts on vocabularies it does not understand; a
        // panic there is an error here.
        let mut words = catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
            .map_err(|_| GrammarError::Vocabulary("unsupported token encoding".into()))?
            .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        if words.len() > model_vocab_size {
            return Err(GrammarError::Vocabulary(format!(
                "the tokenizer has {} ids, more than the model's {model_vocab_size} logits",
                words.len()
            )));
        }
        words.resize(model_vocab_size, Vec::new());
        let eos_ids: Vec<u32> = tokenizer.eos_token_ids().iter().copied().collect();
        let vocab = u32::try_from(model_vocab_size)
            .map_err(|_| GrammarError::Vocabulary("more than 2^32 ids".into()))?;
        let first_eos = *eos_ids.first().ok_or(GrammarError::NoEndOfSequence)?;
        if let Some(&id) = eos_ids.iter().find(|&&id| id >= vocab) {
            return Err(GrammarError::Vocabulary(format!(
                "end-of-sequence id {id} is past the model's {model_vocab_size} logits"
            )));
        }
        let mut info = TokRxInfo::new(vocab, first_eos);
        info.tok_bos = tokenizer.bos_token_id();
        info.tok_pad = tokenizer.pad_token_id();
        let trie = catch_unwind(AssertUnwindSafe(|| {
            TokTrie::from(&info, &words).with_eos_tokens(&eos_ids)
        }))
        .map_err(|_| GrammarError::Vocabulary("building the token trie failed".into()))?;
        let env: toktrie::TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError::Vocabulary(format!("llguidance: {e}")))?;
        factory.quiet();
        *factory.limits_mut() = limits.parser;
        Ok(Self {
            factory,
            eos_ids,
            vocab_size: model_vocab_size,
            max_source_bytes: limits.max_source_bytes,
        })
    }

    /// The error for `spec` failing with `message`, with the schema path
    /// where it can be found.
    fn compile_error(&self, spec: &GrammarSpec, message: String) -> GrammarError {
        let mut error = compile_error(spec.kind(), message);
        if let (GrammarError::Invalid { path, message, .. }, GrammarSpec::JsonSchema(schema)) =
            (&mut error, spec)
        {
            *path = crate::schema_path::locate(&self.factory, schema, message);
        }
        error
    }

    /// The width of the masks: the model's logits.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The tokenizer's end-of-sequence ids, never allowed as ordinary tokens.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Compiles `spec` into a fresh constraint at the start of the output.
    pub fn constraint(&self, spec: &GrammarSpec) -> Result<GrammarConstraint, GrammarError> {
        let kind = spec.kind();
        let bytes = spec.source_len();
        if bytes > self.max_source_bytes {
            return Err(GrammarError::SourceTooLarge {
                kind,
                bytes,
                limit: self.max_source_bytes,
            });
        }
        let grammar = spec.to_llguidance();
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| compile_error(kind, "the grammar compiler failed".into()))?
            .map_err(|e| self.compile_error(spec, format!("{e:#}")))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(compile_error(kind, message));
        }
        for warning in matcher.grammar_warnings() {
            tracing::debug!("{kind}: {warning}");
        }
        Ok(GrammarConstraint::new(
            matcher,
            self.eos_ids.clone(),
            self.vocab_size,
        ))
    }
}

/// llguidance reports limits in its messages only; those naming fuel or a
/// limit are [`GrammarError::TooComplex`].
fn compile_error(kind: GrammarKind, message: String) -> GrammarError {
    let lower = message.to_ascii_lowercase();
    let limits = ["fuel", "limit", "too big", "too large", "exceeded"];
    if limits.iter().any(|word| lower.contains(word)) {
        GrammarError::TooComplex { kind, message }
    } else {
        GrammarError::Invalid {
            kind,
            path: None,
            message,
        }
    }
}
