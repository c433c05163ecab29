//! The streaming split of generated text into reasoning, content and tool
//! calls. Each format family's call syntax lives in its own file; this one
//! holds the state machine they share.

mod gemma4;
mod glm45;
pub(crate) mod harmony;
mod hermes;
mod llama3;
mod mistral;
mod qwen3_coder;
pub(crate) mod scan;
mod typed;

use serde_json::Value;

use crate::{Reasoning, Tool, ToolFormat};
use scan::Scan;

/// One call parsed out of a format's call text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub name: String,
    /// A JSON object.
    pub arguments: Value,
}

/// How one format's calls sit in generated text.
pub(crate) struct Syntax {
    /// Texts that open a call wherever content may be.
    pub opens: &'static [&'static str],
    /// A text that opens a call only where the response, or the text after
    /// a call, begins; it is part of the call (Llama's bare `{`).
    pub opens_at_start: Option<&'static str>,
    /// How far the call reaches, given the text after its open marker (from
    /// the marker on when it is kept).
    pub end: fn(&str) -> Scan,
    /// The calls in a complete call text (what `end` measured); `None`
    /// when it is malformed.
    pub parse: fn(&str, &[Tool]) -> Option<Vec<Call>>,
}

impl ToolFormat {
    /// The format's call syntax; `None` for harmony, whose output is parsed
    /// message by message (`harmony.rs`).
    pub(crate) fn syntax(self) -> Option<Syntax> {
        match self {
            Self::Hermes => Some(hermes::SYNTAX),
            Self::Llama3Json => Some(llama3::SYNTAX),
            Self::Qwen3Coder => Some(qwen3_coder::SYNTAX),
            Self::Mistral => Some(mistral::SYNTAX),
            Self::Glm45 => Some(glm45::SYNTAX),
            Self::Gemma4 => Some(gemma4::SYNTAX),
            Self::Harmony => None,
        }
    }
}

/// A part of the response, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Reasoning text.
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A call opened; `index` counts calls from 0 in this response. Ids are
    /// the API layer's job.
    CallStart {
        /// The call's position among this response's calls.
        index: usize,
        /// The function called.
        name: String,
    },
    /// More of the call's arguments as JSON text; the concatenation of a
    /// call's `CallArguments` is its complete arguments JSON object text.
    CallArguments {
        /// The call's position.
        index: usize,
        /// Argument text.
        json: String,
    },
    /// The call is complete.
    CallEnd {
        /// The call's position.
        index: usize,
    },
}

/// Where the parser is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: reasoning may still open.
    Start,
    /// Inside reasoning.
    Reasoning,
    /// Answer text; `boundary` while only whitespace followed the start,
    /// the reasoning or a call.
    Content { boundary: bool },
    /// Inside a call opened by `marker`; the buffer holds what follows it
    /// (or, when `kept`, the marker too).
    Call { marker: &'static str, kept: bool },
    /// Somewhere in a harmony response (gpt-oss).
    Harmony(harmony::At),
}

/// Streaming split of generated text into reasoning, content and tool calls.
#[derive(Debug)]
pub struct OutputParser {
    format: Option<ToolFormat>,
    reasoning: Option<Reasoning>,
    tools: Vec<Tool>,
    state: State,
    buffer: String,
    /// Reasoning text emitted so far is non-empty (leading whitespace dropped).
    reasoned: bool,
    calls: usize,
}

impl OutputParser {
    /// A parser for one response: calls in `format` (none recognised when
    /// `None`), reasoning between `reasoning`'s markers, already open when
    /// `starts_in_reasoning` (the prompt opened it); `tools` give argument
    /// types to formats that write values untyped (Qwen3-Coder, GLM). The
    /// harmony format (or its reasoning markers) reads the response message
    /// by message; calls only with the format.
    pub fn new(
        format: Option<ToolFormat>,
        reasoning: Option<Reasoning>,
        starts_in_reasoning: bool,
        tools: &[Tool],
    ) -> Self {
        let harmony = format == Some(ToolFormat::Harmony)
            || reasoning.as_ref().is_some_and(Reasoning::is_harmony);
        let state = if harmony {
            State::Harmony(harmony::At::First)
        } else if starts_in_reasoning && reasoning.is_some() {
            State::Reasoning
        } else {
            State::Start
        };
        Self {
            format,
            reasoning,
            tools: tools.to_vec(),
            state,
            buffer: String::new(),
            reasoned: false,
            calls: 0,
        }
    }

    /// Feeds the next decoded text; returns what is now certain. Text that
    /// may be the start of a marker is held back until it is decided.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buffer.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// End of generation: flushes. A call that never closed or whose
    /// arguments are not valid JSON (after the format's conversion) comes
    /// back as content, never an error.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// Takes the first `len` bytes of the buffer.
    fn take(&mut self, len: usize) -> String {
        let rest = self.buffer.split_off(len);
        std::mem::replace(&mut self.buffer, rest)
    }

    fn content(out: &mut Vec<Piece>, text: String) {
        if text.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(Piece::Content(last)) => last.push_str(&text),
            _ => out.push(Piece::Content(text)),
        }
    }

    fn reasoning_text(&mut self, out: &mut Vec<Piece>, mut text: String) {
        if !self.reasoned {
            text = text.trim_start().to_owned();
        }
        if text.is_empty() {
            return;
        }
        self.reasoned = true;
        match out.last_mut() {
            Some(Piece::Reasoning(last)) => last.push_str(&text),
            _ => out.push(Piece::Reasoning(text)),
        }
    }

    /// One move of the state machine; false when it must wait for more text
    /// (or, at `end`, when everything is flushed).
    fn step(&mut self, out: &mut Vec<Piece>, end: bool) -> bool {
        match self.state.clone() {
            State::Start => self.step_start(end),
            State::Reasoning => self.step_reasoning(out, end),
            State::Content { boundary } => self.step_content(out, boundary, end),
            State::Call { marker, kept } => self.step_call(out, marker, kept, end),
            State::Harmony(at) => self.step_harmony(out, at, end),
        }
    }

    fn step_start(&mut self, end: bool) -> bool {
        let trimmed = self.buffer.trim_start();
        if let Some(reasoning) = &self.reasoning {
            let open = reasoning.open;
            if let Some(after) = trimmed.strip_prefix(open) {
                let consumed = self.buffer.len() - after.len();
                self.take(consumed);
                self.state = State::Reasoning;
                return true;
            }
            if !end && (trimmed.is_empty() || open.starts_with(trimmed)) {
                return false;
            }
        }
        self.state = State::Content { boundary: true };
        true
    }

    fn step_reasoning(&mut self, out: &mut Vec<Piece>, end: bool) -> bool {
        let Some(reasoning) = &self.reasoning else {
            self.state = State::Content { boundary: true };
            return true;
        };
        let close = reasoning.close;
        if let Some(at) = self.buffer.find(close) {
            let text = self.take(at);
            self.take(close.len());
            self.reasoning_text(out, text);
            self.state = State::Content { boundary: true };
            return true;
        }
        let hold = if end {
            0
        } else {
            scan::partial_suffix(&self.buffer, &[close])
        };
        let text = self.take(self.buffer.len() - hold);
        self.reasoning_text(out, text);
        false
    }

    fn step_content(&mut self, out: &mut Vec<Piece>, boundary: bool, end: bool) -> bool {
        let Some(syntax) = self.format.and_then(ToolFormat::syntax) else {
            let text = self.take(self.buffer.len());
            let text = if boundary {
                text.trim_start().to_owned()
            } else {
                text
            };
            if !text.is_empty() {
                self.state = State::Content { boundary: false };
            }
            Self::content(out, text);
            return false;
        };
        if boundary {
            let skip = self.buffer.len() - self.buffer.trim_start().len();
            self.take(skip);
            if self.buffer.is_empty() {
                return false;
            }
            if let Some(open) = syntax.opens_at_start {
                if self.buffer.starts_with(open) {
                    self.state = State::Call {
                        marker: open,
                        kept: true,
                    };
                    return true;
                }
            }
            self.state = State::Content { boundary: false };
        }
        if let Some((at, marker)) = scan::find_first(&self.buffer, syntax.opens) {
            let text = self.take(at);
            Self::content(out, text);
            self.take(marker.len());
            self.state = State::Call {
                marker,
                kept: false,
            };
            return true;
        }
        let hold = if end {
            0
        } else {
            scan::partial_suffix(&self.buffer, syntax.opens)
        };
        let text = self.take(self.buffer.len() - hold);
        Self::content(out, text);
        false
    }

    fn step_call(
        &mut self,
        out: &mut Vec<Piece>,
        marker: &'static str,
        kept: bool,
        end: bool,
    ) -> bool {
        let Some(syntax) = self.format.and_then(ToolFormat::syntax) else {
            self.state = State::Content { boundary: false };
            return true;
        };
        // A kept marker is part of the call (and was not taken off the buffer).
        let scanned = match (syntax.end)(&self.buffer) {
            Scan::Done(len) => Some(len),
            Scan::Wait if !end => return false,
            // The end of generation: the call is whatever came, if it parses.
            Scan::Wait => Some(self.buffer.len()),
            Scan::Invalid => None,
        };
        let calls = scanned
            .and_then(|len| (syntax.parse)(&self.buffer[..len], &self.tools).map(|c| (len, c)));
        match calls {
            Some((len, calls)) if !calls.is_empty() => {
                self.take(len);
                for call in calls {
                    let index = self.calls;
                    self.calls += 1;
                    out.push(Piece::CallStart {
                        index,
                        name: call.name,
                    });
                    out.push(Piece::CallArguments {
                        index,
                        json: call.arguments.to_string(),
                    });
                    out.push(Piece::CallEnd { index });
                }
                self.state = State::Content { boundary: true };
            }
            _ => {
                // Not a call after all: the marker is text, and scanning
                // resumes right after it.
                if !kept {
                    Self::content(out, marker.to_owned());
                } else {
                    let text = self.take(marker.len());
                    Self::content(out, text);
                }
                self.state = State::Content { boundary: false };
            }
        }
        true
    }
}

/// One call of a whole response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function called.
    pub name: String,
    /// Its arguments, a JSON object's text.
    pub arguments: String,
}

/// Whole-response view (non-streaming answers): built by pushing every [`Piece`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// All reasoning text.
    pub reasoning: String,
    /// All answer text.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

impl Parsed {
    /// Adds the next piece.
    pub fn push(&mut self, piece: &Piece) {
        match piece {
            Piece::Reasoning(text) => self.reasoning.push_str(text),
            Piece::Content(text) => self.content.push_str(text),
            Piece::CallStart { name, .. } => self.calls.push(ParsedCall {
                name: name.clone(),
                arguments: String::new(),
            }),
            Piece::CallArguments { index, json } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.arguments.push_str(json);
                }
            }
            Piece::CallEnd { .. } => {}
        }
    }

    /// The whole-response view of `pieces`.
    pub fn of(pieces: &[Piece]) -> Self {
        let mut parsed = Self::default();
        for piece in pieces {
            parsed.push(piece);
        }
        parsed
    }
}

#[cfg(test)]
mod tests;
