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
// The Messages and Responses APIs report the same stats and read tools and
// tool choices the same way.
pub use chat_request::{tool_choice_of, tools_of, ToolShape};
pub use chat_shape::call_id;
pub use shape::{spec_json, timings_json};
