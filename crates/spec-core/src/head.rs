//! What the chained heads share (GLM's MTP row, Qwen's MTP head, EAGLE-3):
//! a head appends one cache row per drafted token, conditioned on the
//! previous step's own output; a commit keeps the first row (the only one
//! conditioned on a true target state), then absorbs the accepted drafts
//! and the host's foreign tokens after them with the verified states. The
//! loop that samples a chain ([`draft_chain`]) and the checks of a commit
//! against the round ([`commit_tokens`]) live here once.

use mlx_rs::ops::concatenate;
use mlx_rs::{Array, Dtype};

use crate::{CommitInfo, Draft, Sampler, SpecError};

fn protocol(message: String) -> SpecError {
    SpecError::Protocol(message)
}

/// Drafts up to `n` tokens: each step gives the log-probabilities of the
/// next token (over the target's vocabulary, `[1, vocab]`) and the state
/// the step after it conditions on, from the previous token and state;
/// the first step starts from `first` and `anchor`. Sampled with the
/// request's `sampler` (its probabilities kept for rejection sampling when
/// it is not greedy).
pub fn draft_chain(
    first: u32,
    anchor: Array,
    n: usize,
    sampler: &mut dyn Sampler,
    mut step: impl FnMut(u32, &Array) -> Result<(Array, Array), SpecError>,
) -> Result<Draft, SpecError> {
    let mut token = first;
    let mut state = anchor;
    let mut tokens = Vec::with_capacity(n);
    let mut probs = Vec::new();
    for _ in 0..n {
        let (logprobs, next) = step(token, &state)?;
        let chosen = sampler.sample(&logprobs)?.as_dtype(Dtype::Uint32)?;
        chosen.eval()?;
        token = chosen
            .as_slice::<u32>()
            .first()
            .copied()
            .ok_or(SpecError::Internal("sampler returned no token"))?;
        if !sampler.is_greedy() {
            probs.push(sampler.probabilities(&logprobs)?);
        }
        tokens.push(token);
        state = next;
    }
    let probs = if probs.is_empty() {
        None
    } else {
        Some(concatenate(&probs, 0)?)
    };
    Ok(Draft { tokens, probs })
}

/// Checks a commit against a round that drafted `drafted` tokens and
/// returns the tokens the head absorbs: the accepted drafts, then the
/// host's foreign tokens after them.
pub fn commit_tokens(info: &CommitInfo<'_>, drafted: usize) -> Result<Vec<u32>, SpecError> {
    let k = info.accepted;
    if info.drafted != drafted {
        return Err(protocol(format!(
            "commit of {} drafted tokens, but {drafted} were drafted",
            info.drafted
        )));
    }
    if k > drafted {
        return Err(protocol(format!("{k} accepted outside [0, {drafted}]")));
    }
    if info.accepted_tokens.len() != k {
        return Err(protocol(format!(
            "{} accepted tokens given for k = {k}",
            info.accepted_tokens.len()
        )));
    }
    if !info.foreign.is_empty() && drafted == 0 {
        return Err(protocol(format!(
            "{} foreign tokens after a round that drafted nothing",
            info.foreign.len()
        )));
    }
    Ok([info.accepted_tokens, info.foreign].concat())
}

/// The cache length a head must hold after committing `absorbed` tokens
/// of a round that began at `round_start` and drafted `drafted`: the first
/// row kept (when it drafted), then one per absorbed token.
pub fn committed_rows(round_start: usize, drafted: usize, absorbed: usize) -> usize {
    round_start + usize::from(drafted > 0) + absorbed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GreedySampler;

    fn info<'a>(
        drafted: usize,
        accepted: &'a [u32],
        foreign: &'a [u32],
        h: &'a Array,
    ) -> CommitInfo<'a> {
        CommitInfo {
            drafted,
            accepted: accepted.len(),
            accepted_tokens: accepted,
            foreign,
            next: 0,
            verified_taps: None,
            verified_hidden: h,
        }
    }

    #[test]
    fn a_commit_absorbs_accepted_then_foreign_and_refuses_what_does_not_fit() {
        let h = Array::from_f32(0.0);
        assert_eq!(
            commit_tokens(&info(3, &[4, 5], &[9], &h), 3).expect("ok"),
            [4, 5, 9]
        );
        assert!(
            commit_tokens(&info(3, &[4], &[], &h), 2).is_err(),
            "drafted mismatch"
        );
        assert!(
            commit_tokens(&info(1, &[4, 5], &[], &h), 1).is_err(),
            "more than drafted"
        );
        assert!(
            commit_tokens(&info(0, &[], &[9], &h), 0).is_err(),
            "foreign after nothing"
        );
        assert_eq!(committed_rows(10, 3, 2), 13);
        assert_eq!(committed_rows(10, 0, 0), 10);
    }

    #[test]
    fn a_chain_feeds_each_step_the_previous_token_and_state() {
        // Step i: the token after `t` is `t + 1` (a one-hot log-probability
        // row), the next state the previous plus one.
        let mut seen = Vec::new();
        let draft = draft_chain(3, Array::from_f32(0.0), 4, &mut GreedySampler, |t, s| {
            s.eval()?;
            seen.push((t, s.item_exact::<f32>()));
            let mut row = vec![-1e9f32; 16];
            row[t as usize + 1] = 0.0;
            Ok((
                Array::from_slice(&row, &[1, 16]),
                s.add(Array::from_f32(1.0))?,
            ))
        })
        .expect("chain");
        assert_eq!(draft.tokens, [4, 5, 6, 7]);
        assert!(draft.probs.is_none(), "greedy keeps no probabilities");
        assert_eq!(seen, [(3, 0.0), (4, 1.0), (5, 2.0), (6, 3.0)]);
    }
}
