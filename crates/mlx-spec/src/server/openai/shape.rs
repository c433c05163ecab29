//! Pieces of OpenAI's answers both endpoints share: usage, our
//! `speculative` report, ids and times.

use serde_json::{json, Value};

use crate::server::worker::Done;

/// Our `speculative` extension: the provider and its counts, `null` when
/// the request ran without speculation.
pub fn spec_json(done: &Done) -> Value {
    match &done.provider {
        None => Value::Null,
        Some(p) => json!({
            "provider": p,
            "drafted": done.stats.drafted,
            "accepted": done.stats.accepted,
            "acceptance_rate": done.stats.acceptance_rate(),
            "mean_accepted_length": done.stats.mean_accepted_length(),
            "tokens_per_target_forward": done.stats.tokens_per_forward(),
            "target_calls": done.stats.target_calls,
        }),
    }
}

/// `usage`, with the prompt tokens the prefix cache served.
pub fn usage(done: &Done) -> Value {
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    })
}
