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

/// Our `timings` extension: seconds to the first token (queue, prefill,
/// first step) and after it, and the tokens per second after it (what
/// speculation speeds up).
pub fn timings_json(done: &Done) -> Value {
    let t = done.timings;
    let later = done.completion_tokens.saturating_sub(1);
    json!({
        "prompt_seconds": t.prompt_seconds,
        "generation_seconds": t.generation_seconds,
        "generation_tokens_per_second": if t.generation_seconds > 0.0 {
            later as f64 / t.generation_seconds
        } else {
            0.0
        },
    })
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
