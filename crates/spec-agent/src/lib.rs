//! Agent-facing text: the tools a request declares, the tool-call format and
//! reasoning markers a model's chat template uses, the streaming parser that
//! splits generated text into reasoning, content and calls, and the grammar
//! that keeps calls well formed.
//!
//! Everything here is text in, text out: no tokens, no model. The chat
//! template's source decides the format ([`ToolFormat::detect`]) and the
//! reasoning markers ([`Reasoning::detect`]); an [`OutputParser`] per
//! response turns decoded text into [`Piece`]s; [`output_grammar`] writes the
//! llguidance grammar a `tool_choice` or `response_format` asks for, in the
//! model's own call syntax.
#![warn(missing_docs)]

mod error;
mod format;
mod grammar;
mod messages;
mod parser;
mod reasoning;
mod tools;

pub use error::AgentError;
pub use format::ToolFormat;
pub use grammar::output_grammar;
pub use messages::template_messages;
pub use parser::{OutputParser, Parsed, ParsedCall, Piece};
pub use reasoning::Reasoning;
pub use tools::{check_tools, fallback_call_text, fallback_tools_prompt, Tool, ToolChoice};
