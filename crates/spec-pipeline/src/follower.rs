//! The loop every rank but 0 runs: receive a command from the rank before,
//! relay it to the rank after, bring each row's caches to the offset the
//! command names, receive the hidden states from the rank after (the last
//! rank embeds the tokens instead), run the held layers and send the result
//! (with the tapped layers so far) to the rank before.

use std::collections::HashMap;

use mlx_distributed::Group;
use mlx_rs::ops::indexing::IndexOp;
use spec_core::{BatchRow, CacheSet};
use spec_models::pipeline::Stage;

use crate::link::{recv, recv_command, send, send_command};
use crate::protocol::{taps_below, Command, RowCommand};
use crate::PipelineError;

/// What a follower did before the head shut it down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowerReport {
    /// Forwards run.
    pub forwards: u64,
    /// Tokens run through the held layers.
    pub tokens: u64,
    /// Bytes this rank sent (commands relayed and hidden states).
    pub bytes_sent: u64,
}

/// Runs the follower loop of `stage` (a rank other than 0 of `group`) until
/// the head sends shutdown. A lost neighbour or a failing stage ends it with
/// an error naming this rank and the peer.
pub fn run_follower(stage: &dyn Stage, group: &Group) -> Result<FollowerReport, PipelineError> {
    let (rank, size) = (group.rank(), group.size());
    let slice = stage.slice();
    if rank == 0 || slice.rank() != rank || slice.size() != size {
        return Err(PipelineError::Setup(format!(
            "rank {rank} of {size} cannot follow with the slice of rank {} of {}",
            slice.rank(),
            slice.size()
        )));
    }
    let stage_err = |source| PipelineError::Stage { rank, source };
    let hidden = i32::try_from(stage.target().info().hidden_size)
        .map_err(|_| PipelineError::Setup("hidden size does not fit int32".into()))?;
    let dtype = stage.hidden_dtype().map_err(stage_err)?;
    let start = stage.layer_range().start;
    let vocab = stage.target().info().vocab_size;
    let mut sets: HashMap<u32, CacheSet> = HashMap::new();
    let mut report = FollowerReport::default();
    loop {
        // Checked before it is relayed: a malformed command goes no further.
        let (header, body, command) = recv_command(group, rank - 1)?;
        if let Command::Forward { rows, .. } = &command {
            check_tokens(rows, vocab).map_err(|m| {
                PipelineError::Protocol(format!(
                    "rank {rank}: a command from rank {}: {m}",
                    rank - 1
                ))
            })?;
        }
        if rank + 1 < size {
            report.bytes_sent += send_command(group, &header, &body, rank + 1)? as u64;
        }
        let (rows, taps, freed, copies) = match command {
            Command::Shutdown => {
                tracing::debug!(rank, ?report, "pipeline follower shut down");
                return Ok(report);
            }
            Command::Forward {
                rows,
                taps,
                freed,
                copies,
            } => (rows, taps, freed, copies),
        };
        // Copies first: a set may be duplicated and dropped before one
        // command.
        for (from, to) in copies {
            let copy = sets.get(&from).and_then(CacheSet::duplicate).ok_or_else(|| {
                PipelineError::Protocol(format!(
                    "rank {rank}: cache set {from} cannot be copied (unknown, or a cache without copies)"
                ))
            })?;
            sets.insert(to, copy);
        }
        for id in freed {
            sets.remove(&id);
        }
        let mut taken =
            take_sets(&mut sets, &rows, || stage.stage_caches()).map_err(|e| e.at(rank))?;
        let total: usize = rows.iter().map(|r| r.tokens.len()).sum();
        let result = (|| {
            let below = taps_below(&taps, start);
            let input = if rank + 1 < size {
                let width = hidden * (1 + below as i32);
                Some(recv(group, &[1, total as i32, width], dtype, rank + 1)?)
            } else {
                None
            };
            let (h_in, taps_in) = match &input {
                Some(x) if below > 0 => (
                    Some(x.index((.., .., ..hidden))),
                    Some(x.index((.., .., hidden..))),
                ),
                other => (other.clone(), None),
            };
            let mut batch: Vec<BatchRow<'_>> = rows
                .iter()
                .zip(taken.iter_mut())
                .map(|(r, (_, caches))| BatchRow {
                    tokens: &r.tokens,
                    caches,
                    form: r.form,
                })
                .collect();
            let (h, tapped) = stage
                .run_stage(h_in.as_ref(), &mut batch, &taps)
                .map_err(stage_err)?;
            let mut parts = vec![h];
            parts.extend(taps_in);
            parts.extend(tapped.into_iter().map(|(_, t)| t));
            let message = if parts.len() == 1 {
                parts.remove(0)
            } else {
                mlx_rs::ops::concatenate(&parts, -1)
                    .map_err(|e| stage_err(spec_core::SpecError::Mlx(e)))?
            };
            send(group, &message, rank - 1)
        })();
        sets.extend(taken);
        report.bytes_sent += result? as u64;
        report.forwards += 1;
        report.tokens += total as u64;
    }
}

/// Every token of `rows` is an id of the model's vocabulary (the last rank
/// looks them up in its embeddings).
fn check_tokens(rows: &[RowCommand], vocab: usize) -> Result<(), String> {
    for (i, r) in rows.iter().enumerate() {
        if let Some(t) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!(
                "row {i} holds token {t}, past the vocabulary of {vocab}"
            ));
        }
    }
    Ok(())
}

/// A row's cache set and the offset it must stand at disagree.
#[derive(Debug)]
pub(crate) struct OffsetError(String);

impl OffsetError {
    fn at(self, rank: usize) -> PipelineError {
        PipelineError::Protocol(format!("rank {rank}: {}", self.0))
    }
}

/// Takes each row's cache set out of `sets` (a fresh one from `fresh` for a
/// set not seen before), trimmed to the row's offset: the head's caches
/// rolled back to that offset since the last forward.
pub(crate) fn take_sets(
    sets: &mut HashMap<u32, CacheSet>,
    rows: &[RowCommand],
    fresh: impl Fn() -> CacheSet,
) -> Result<Vec<(u32, CacheSet)>, OffsetError> {
    let mut taken: Vec<(u32, CacheSet)> = Vec::with_capacity(rows.len());
    let mut fail = None;
    for r in rows {
        if taken.iter().any(|(id, _)| *id == r.set) {
            fail = Some(format!("cache set {} appears twice in one forward", r.set));
            break;
        }
        let mut set = sets.remove(&r.set).unwrap_or_else(&fresh);
        let have = set.offset();
        if have < r.offset {
            fail = Some(format!(
                "cache set {} holds {have} tokens, the head's {}",
                r.set, r.offset
            ));
        } else if have > r.offset {
            if let Err(e) = set.trim(have - r.offset) {
                fail = Some(format!("cache set {}: {e}", r.set));
            }
        }
        taken.push((r.set, set));
        if fail.is_some() {
            break;
        }
    }
    match fail {
        None => Ok(taken),
        Some(message) => {
            sets.extend(taken);
            Err(OffsetError(message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tokens: Vec<u32>) -> RowCommand {
        RowCommand {
            set: 0,
            offset: 0,
            form: spec_core::RowForm::Prefill,
            tokens,
        }
    }

    #[test]
    fn tokens_past_the_vocabulary_are_refused_naming_the_row() {
        assert!(check_tokens(&[row(vec![0, 9])], 10).is_ok());
        let e = check_tokens(&[row(vec![1]), row(vec![3, 10])], 10).expect_err("past");
        assert_eq!(e, "row 1 holds token 10, past the vocabulary of 10");
        assert!(check_tokens(&[row(vec![u32::MAX])], 10).is_err());
    }
}
