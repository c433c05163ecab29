//! Text in and out of the models: a tokenizer loaded from a Hugging Face
//! `tokenizer.json` or built from GGUF metadata, streaming detokenization for
//! printing generated text, and chat templates rendered as transformers does.
#![warn(missing_docs)]

mod chat;
mod error;
mod gguf;
mod hf_export;
mod hf_files;
mod message;
mod pyjson;
mod stream;
mod tokenizer;

pub use chat::{ChatTemplate, RenderOptions};
pub use error::TextError;
pub use message::{tool_call, Message};
pub use pyjson::python_json;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
