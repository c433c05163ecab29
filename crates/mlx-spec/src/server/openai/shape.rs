//! Pieces of OpenAI's answers both endpoints share: usage, our
//! `speculative` report, ids and times.

use serde_json::{json, Value};

use spec_core::SpecStats;

use crate::server::worker::Done;

/// Our `speculative` extension: the provider and its counts, `null` when
/// the request ran without speculation.
pub fn spec_json(done: &Done) -> Value {
    spec_json_of(&[done])
}

/// `speculative` of several choices: their counts summed (`null` when
/// none speculated).
pub fn spec_json_of(dones: &[&Done]) -> Value {
    let Some(provider) = dones.iter().find_map(|d| d.provider.as_ref()) else {
        return Value::Null;
    };
    let mut stats = SpecStats::default();
    for d in dones {
        stats.absorb(&d.stats);
    }
    json!({
        "provider": provider,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate(),
        "mean_accepted_length": stats.mean_accepted_length(),
        "tokens_per_target_forward": stats.tokens_per_forward(),
        "target_calls": stats.target_calls,
    })
}

/// Our `timings` extension: seconds to the first token (queue, prefill,
/// first step) and after it, and the tokens per second after it (what
/// speculation speeds up).
pub fn timings_json(done: &Done) -> Value {
    timings_json_of(&[done])
}

/// `timings` of several choices: to the first token any choice emitted,
/// from there to the last choice's end, and every later token over that.
pub fn timings_json_of(dones: &[&Done]) -> Value {
    let first = dones
        .iter()
        .map(|d| d.timings.prompt_seconds)
        .fold(f64::INFINITY, f64::min);
    let first = if first.is_finite() { first } else { 0.0 };
    let end = dones
        .iter()
        .map(|d| d.timings.prompt_seconds + d.timings.generation_seconds)
        .fold(first, f64::max);
    let generation_seconds = end - first;
    let tokens: usize = dones.iter().map(|d| d.completion_tokens).sum();
    let later = tokens.saturating_sub(1);
    json!({
        "prompt_seconds": first,
        "generation_seconds": generation_seconds,
        "generation_tokens_per_second": if generation_seconds > 0.0 {
            later as f64 / generation_seconds
        } else {
            0.0
        },
    })
}

/// `usage`, with the prompt tokens the prefix cache served, of several
/// choices, `per_prompt` of them for each prompt (in
/// order): each prompt's tokens counted once (its first choice's), every
/// choice's completion.
pub fn usage_of(dones: &[&Done], per_prompt: usize) -> Value {
    let firsts = dones.iter().step_by(per_prompt.max(1));
    let (prompt, cached) = firsts.fold((0, 0), |(p, c), d| {
        (p + d.prompt_tokens, c + d.cached_tokens)
    });
    let completion: usize = dones.iter().map(|d| d.completion_tokens).sum();
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    });
    if dones.iter().any(|d| d.predicted) {
        // OpenAI's predicted-output counts: the drafts accepted and
        // rejected (prompt lookup's, the prediction's among them).
        let (accepted, rejected) = dones.iter().fold((0, 0), |(a, r), d| {
            (a + d.stats.accepted, r + d.stats.rejected)
        });
        usage["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
        });
    }
    usage
}
