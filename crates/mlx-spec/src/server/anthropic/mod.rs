//! Anthropic's Messages API on the same engine as the OpenAI routes:
//! `POST /v1/messages` (streamed as Anthropic's named SSE events or not)
//! and `POST /v1/messages/count_tokens`. Requests translate into the chat
//! pipeline's turn; answers are content blocks built from its pieces.

mod errors;
