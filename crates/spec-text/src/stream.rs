//! Incremental detokenization: ids go in one at a time, text comes out as soon
//! as it is complete.

use std::sync::Arc;

use crate::{TextError, Tokenizer};

/// Decodes ids one at a time, for printing generated text as it comes.
///
/// A byte-level BPE token may end in the middle of a UTF-8 character, and some
/// decoders render a token differently depending on its left neighbour (a
/// leading space), so text is produced by decoding a short window of ids and
/// returning what it adds to the text already returned. Text is held back while
/// it ends in an incomplete character, so no character is ever split. The
/// pieces returned by [`step`](Self::step) followed by [`finish`](Self::finish)
/// concatenate to [`Tokenizer::decode`] of all the ids.
pub struct StreamDecoder<'a> {
    tokenizer: Source<'a>,
    skip_special_tokens: bool,
    /// The ids decoded together: `context` ids whose text was returned last
    /// time, then the ids whose text is still pending.
    window: Vec<u32>,
    context: usize,
    /// The text of the whole window as of the last return.
    returned: String,
}

/// The tokenizer a decoder reads: borrowed, or shared so that the decoder
/// can move to another thread on its own.
enum Source<'a> {
    Borrowed(&'a Tokenizer),
    Shared(Arc<Tokenizer>),
}

impl std::ops::Deref for Source<'_> {
    type Target = Tokenizer;

    fn deref(&self) -> &Tokenizer {
        match self {
            Source::Borrowed(t) => t,
            Source::Shared(t) => t,
        }
    }
}

impl StreamDecoder<'static> {
    /// A decoder holding its own handle on `tokenizer` (for a thread other
    /// than the tokenizer owner's).
    pub fn shared(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self::with(Source::Shared(tokenizer), skip_special_tokens)
    }
}

impl std::fmt::Debug for StreamDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDecoder")
            .field("window", &self.window)
            .field("context", &self.context)
            .field("returned", &self.returned)
            .finish_non_exhaustive()
    }
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        Self::with(Source::Borrowed(tokenizer), skip_special_tokens)
    }

    fn with(tokenizer: Source<'a>, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            window: Vec::new(),
            context: 0,
            returned: String::new(),
        }
    }

    /// Feeds one id; returns the text it completes, which is empty while a
    /// character is still incomplete (or the id decodes to nothing).
    pub fn step(&mut self, id: u32) -> Result<String, TextError> {
        self.window.push(id);
        let text = self
            .tokenizer
            .decode(&self.window, self.skip_special_tokens)?;
        if text.len() <= self.returned.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let new = self.new_text(&text)?;
        // The ids just decoded become the left context of the next window.
        self.window.drain(..self.context);
        self.context = self.window.len();
        self.returned = self
            .tokenizer
            .decode(&self.window, self.skip_special_tokens)?;
        Ok(new)
    }

    /// Returns whatever is still held back (an incomplete character decodes as
    /// U+FFFD, as [`Tokenizer::decode`] would) and starts over.
    pub fn finish(&mut self) -> Result<String, TextError> {
        let text = self
            .tokenizer
            .decode(&self.window, self.skip_special_tokens)?;
        let rest = if text.len() > self.returned.len() {
            self.new_text(&text)?
        } else {
            String::new()
        };
        self.window.clear();
        self.context = 0;
        self.returned.clear();
        Ok(rest)
    }

    fn new_text(&self, text: &str) -> Result<String, TextError> {
        text.strip_prefix(self.returned.as_str())
            .map(str::to_owned)
            .ok_or_else(|| TextError::UnstableDecode {
                emitted: self.returned.clone(),
            })
    }
}
