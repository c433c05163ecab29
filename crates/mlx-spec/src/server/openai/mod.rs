//! OpenAI's API: Chat Completions (tools, reasoning, structured output
//! through the shared chat path) and the legacy Completions.

mod chat;
mod chat_messages;
mod chat_request;
mod chat_shape;
mod completions;
mod shape;

pub use chat::chat;
pub use completions::completions;
// The Messages API reports the same stats.
pub use shape::spec_json;
