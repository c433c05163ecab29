//! The follower protocol: what rank 0 sends down the pipeline before each
//! forward. A command is two int32 arrays, a fixed header and a body whose
//! length the header gives, relayed rank to rank (`0 -> 1 -> .. -> N-1`);
//! the hidden states then flow back (`N-1 -> .. -> 0`), each rank adding
//! the tapped layers it holds after the hidden states on the last axis.

use spec_core::RowForm;

use crate::PipelineError;

/// Int32 values in a command header.
pub const HEADER_LEN: usize = 7;

/// First header value: guards against a peer speaking something else.
const MAGIC: i32 = 0x5350_4950; // "SPIP"

const FORWARD: i32 = 1;
const SHUTDOWN: i32 = 2;

/// One request's window in a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowCommand {
    /// The head's id of the request's cache set.
    pub set: u32,
    /// The caches' offset before this step: a follower first trims its own
    /// copy down to it (how rejected drafts roll back everywhere).
    pub offset: usize,
    /// Prefill chunk or decoding rows.
    pub form: RowForm,
    /// The window's tokens.
    pub tokens: Vec<u32>,
}

/// What the followers are told to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run one forward over `rows` (several for a batch).
    Forward {
        /// The rows, in packing order.
        rows: Vec<RowCommand>,
        /// Requested tapped layers, ascending, without repeats.
        taps: Vec<usize>,
        /// Cache sets dropped on the head since the last command.
        freed: Vec<u32>,
        /// Cache sets duplicated on the head since the last command,
        /// `(source, copy)` in order; a follower makes the copies first.
        copies: Vec<(u32, u32)>,
    },
    /// The head is done: free everything and exit.
    Shutdown,
}

fn int(v: usize, what: &str) -> Result<i32, PipelineError> {
    i32::try_from(v).map_err(|_| PipelineError::Protocol(format!("{what} {v} does not fit int32")))
}

/// Rows in one command (the serve loop's `--max-batch` is far below).
pub const MAX_ROWS: usize = 1 << 16;
/// Tokens in one command: a follower receives `tokens x hidden` values of
/// hidden states, so this bounds what a command makes it allocate.
pub const MAX_TOKENS: usize = 1 << 18;
/// Tapped layers in one command (more than any model's layers).
pub const MAX_TAPS: usize = 1 << 12;
/// Cache sets freed, or copied, in one command.
pub const MAX_SETS: usize = 1 << 20;

fn bounded(v: i32, what: &str, max: usize) -> Result<usize, PipelineError> {
    let n = uint(v, what)?;
    if n > max {
        return Err(PipelineError::Protocol(format!(
            "{n} {what} in one command, more than the {max} allowed"
        )));
    }
    Ok(n)
}

fn uint(v: i32, what: &str) -> Result<usize, PipelineError> {
    usize::try_from(v).map_err(|_| PipelineError::Protocol(format!("negative {what} {v}")))
}

impl Command {
    /// The header and body, as int32 values.
    pub fn encode(&self) -> Result<([i32; HEADER_LEN], Vec<i32>), PipelineError> {
        match self {
            Command::Shutdown => Ok(([MAGIC, SHUTDOWN, 0, 0, 0, 0, 0], Vec::new())),
            Command::Forward {
                rows,
                taps,
                freed,
                copies,
            } => {
                let tokens: usize = rows.iter().map(|r| r.tokens.len()).sum();
                let header = [
                    MAGIC,
                    FORWARD,
                    int(rows.len(), "rows")?,
                    int(tokens, "tokens")?,
                    int(taps.len(), "taps")?,
                    int(freed.len(), "freed sets")?,
                    int(copies.len(), "copied sets")?,
                ];
                // What the followers would refuse is refused here.
                Self::body_len(&header)?;
                let mut body = Vec::with_capacity(
                    4 * rows.len() + tokens + taps.len() + freed.len() + 2 * copies.len(),
                );
                for r in rows {
                    body.push(r.set as i32);
                    body.push(int(r.offset, "offset")?);
                    body.push(match r.form {
                        RowForm::Prefill => 0,
                        RowForm::Decode => 1,
                    });
                    body.push(int(r.tokens.len(), "row length")?);
                }
                for r in rows {
                    body.extend(r.tokens.iter().map(|&t| t as i32));
                }
                for &t in taps {
                    body.push(int(t, "tap")?);
                }
                body.extend(freed.iter().map(|&f| f as i32));
                for &(from, to) in copies {
                    body.extend([from as i32, to as i32]);
                }
                Ok((header, body))
            }
        }
    }

    /// The body length a header announces, within the protocol's limits
    /// (a header is read before its body, so the limits bound what a peer
    /// can make this rank allocate).
    pub fn body_len(header: &[i32]) -> Result<usize, PipelineError> {
        let [magic, kind, rows, tokens, taps, freed, copies] = header else {
            return Err(PipelineError::Protocol(format!(
                "a command header has {HEADER_LEN} values, got {}",
                header.len()
            )));
        };
        if *magic != MAGIC {
            return Err(PipelineError::Protocol(format!(
                "not a pipeline command (header starts {magic:#x})"
            )));
        }
        match *kind {
            SHUTDOWN => match [rows, tokens, taps, freed, copies].iter().all(|&&v| v == 0) {
                true => Ok(0),
                false => Err(PipelineError::Protocol(
                    "a shutdown command announces a body".into(),
                )),
            },
            FORWARD => {
                let rows = bounded(*rows, "rows", MAX_ROWS)?;
                let tokens = bounded(*tokens, "tokens", MAX_TOKENS)?;
                let taps = bounded(*taps, "taps", MAX_TAPS)?;
                let freed = bounded(*freed, "freed sets", MAX_SETS)?;
                let copies = bounded(*copies, "copied sets", MAX_SETS)?;
                // Each term is bounded: the sum cannot overflow, and stays
                // under int32 (the length of the body's array).
                Ok(4 * rows + tokens + taps + freed + 2 * copies)
            }
            other => Err(PipelineError::Protocol(format!(
                "unknown command kind {other}"
            ))),
        }
    }

    /// Reads a command back from its header and body. Any inconsistency (a
    /// truncated or padded body, rows whose lengths disagree with the
    /// header, negative values, taps out of order) is an error, never a
    /// panic.
    pub fn decode(header: &[i32], body: &[i32]) -> Result<Self, PipelineError> {
        let len = Self::body_len(header)?;
        if body.len() != len {
            return Err(PipelineError::Protocol(format!(
                "the header announces {len} body values, got {}",
                body.len()
            )));
        }
        if header[1] == SHUTDOWN {
            return Ok(Command::Shutdown);
        }
        let (n, ntokens, ntaps, nfreed) = (
            uint(header[2], "rows")?,
            uint(header[3], "tokens")?,
            uint(header[4], "taps")?,
            uint(header[5], "freed sets")?,
        );
        let (meta, rest) = body.split_at(4 * n);
        let (tokens, rest) = rest.split_at(ntokens);
        let (taps, rest) = rest.split_at(ntaps);
        let (freed, copies) = rest.split_at(nfreed);
        let mut at = 0usize;
        let mut rows = Vec::with_capacity(n);
        for m in meta.chunks_exact(4) {
            let len = uint(m[3], "row length")?;
            let row = at
                .checked_add(len)
                .and_then(|end| tokens.get(at..end))
                .ok_or_else(|| {
                    PipelineError::Protocol(format!(
                        "row {} runs past the {ntokens} tokens the header announces",
                        rows.len()
                    ))
                })?;
            at += len;
            rows.push(RowCommand {
                set: m[0] as u32,
                offset: uint(m[1], "offset")?,
                form: match m[2] {
                    0 => RowForm::Prefill,
                    1 => RowForm::Decode,
                    other => {
                        return Err(PipelineError::Protocol(format!("unknown row form {other}")))
                    }
                },
                tokens: row
                    .iter()
                    .map(|&t| uint(t, "token").map(|t| t as u32))
                    .collect::<Result<_, _>>()?,
            });
        }
        if at != ntokens {
            return Err(PipelineError::Protocol(format!(
                "the rows hold {at} tokens, the header announces {ntokens}"
            )));
        }
        let taps: Vec<usize> = taps
            .iter()
            .map(|&t| uint(t, "tap"))
            .collect::<Result<_, _>>()?;
        if taps.windows(2).any(|w| w[0] >= w[1]) {
            return Err(PipelineError::Protocol(
                "the tapped layers are not ascending without repeats".into(),
            ));
        }
        Ok(Command::Forward {
            rows,
            taps,
            freed: freed.iter().map(|&f| f as u32).collect(),
            copies: copies
                .chunks_exact(2)
                .map(|c| (c[0] as u32, c[1] as u32))
                .collect(),
        })
    }
}

/// How many of `taps` (ascending) lie below layer `end`: the tapped outputs
/// a message leaving the rank whose layers end at `end` carries.
pub fn taps_below(taps: &[usize], end: usize) -> usize {
    taps.iter().filter(|&&t| t < end).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(command: Command) {
        let (header, body) = command.encode().expect("protocol");
        assert_eq!(Command::body_len(&header).expect("protocol"), body.len());
        assert_eq!(Command::decode(&header, &body).expect("protocol"), command);
    }

    #[test]
    fn commands_round_trip() {
        check(Command::Shutdown);
        check(Command::Forward {
            rows: vec![
                RowCommand {
                    set: 3,
                    offset: 17,
                    form: RowForm::Decode,
                    tokens: vec![5, 6, 7],
                },
                RowCommand {
                    set: 9,
                    offset: 0,
                    form: RowForm::Prefill,
                    tokens: vec![u32::MAX >> 1],
                },
            ],
            taps: vec![1, 4],
            freed: vec![2],
            copies: vec![(3, 11), (11, 12)],
        });
    }

    fn one_row() -> ([i32; HEADER_LEN], Vec<i32>) {
        Command::Forward {
            rows: vec![RowCommand {
                set: 0,
                offset: 0,
                form: RowForm::Prefill,
                tokens: vec![1, 2],
            }],
            taps: vec![3],
            freed: vec![4],
            copies: vec![(5, 6)],
        }
        .encode()
        .expect("protocol")
    }

    fn refused(header: &[i32], body: &[i32], why: &str) {
        match Command::decode(header, body) {
            Err(PipelineError::Protocol(message)) => {
                assert!(message.contains(why), "{message:?} should say {why:?}")
            }
            other => panic!("{header:?} {body:?} decoded as {other:?}"),
        }
    }

    #[test]
    fn a_foreign_header_is_refused() {
        refused(&[1, FORWARD, 0, 0, 0, 0, 0], &[], "not a pipeline command");
        refused(&[MAGIC, 7, 0, 0, 0, 0, 0], &[], "unknown command kind 7");
        refused(&[MAGIC, FORWARD, 0, 0, 0], &[], "has 7 values, got 5");
        refused(
            &[MAGIC, SHUTDOWN, 1, 0, 0, 0, 0],
            &[],
            "shutdown command announces",
        );
    }

    #[test]
    fn negative_counts_are_refused() {
        refused(&[MAGIC, FORWARD, -1, 0, 0, 0, 0], &[], "negative rows");
        refused(
            &[MAGIC, FORWARD, 0, 0, 0, 0, -1],
            &[],
            "negative copied sets",
        );
        refused(
            &[MAGIC, FORWARD, 0, i32::MIN, 0, 0, 0],
            &[],
            "negative tokens",
        );
    }

    #[test]
    fn absurd_counts_are_refused_before_any_allocation() {
        // Every count at int32's maximum: the old sum (4 rows + ..) was 17G
        // values, a body this rank would have tried to receive.
        let max = i32::MAX;
        refused(
            &[MAGIC, FORWARD, max, max, max, max, max],
            &[],
            "rows in one command",
        );
        refused(
            &[MAGIC, FORWARD, 0, max, 0, 0, 0],
            &[],
            "tokens in one command",
        );
        refused(
            &[MAGIC, FORWARD, 0, 0, max, 0, 0],
            &[],
            "taps in one command",
        );
        refused(
            &[MAGIC, FORWARD, 0, 0, 0, 0, max],
            &[],
            "copied sets in one command",
        );
        let at_limits = [
            MAGIC,
            FORWARD,
            MAX_ROWS as i32,
            MAX_TOKENS as i32,
            MAX_TAPS as i32,
            MAX_SETS as i32,
            MAX_SETS as i32,
        ];
        let len = Command::body_len(&at_limits).expect("the limits themselves are allowed");
        assert!(i32::try_from(len).is_ok(), "{len} fits a body array");
    }

    #[test]
    fn truncated_or_padded_bodies_are_refused() {
        let (header, body) = one_row();
        let n = body.len();
        let said = format!("announces {n} body values, got");
        refused(&header, &body[..n - 1], &format!("{said} {}", n - 1));
        refused(&header, &[], &format!("{said} 0"));
        let mut padded = body.clone();
        padded.push(0);
        refused(&header, &padded, &format!("{said} {}", n + 1));
    }

    #[test]
    fn rows_that_disagree_with_the_header_are_refused() {
        let (header, body) = one_row();
        // Row 0 claims more tokens than the body holds.
        let mut long = body.clone();
        long[3] = i32::MAX;
        refused(&header, &long, "row 0 runs past the 2 tokens");
        // ..or fewer than the header announces.
        let mut short = body.clone();
        short[3] = 1;
        refused(
            &header,
            &short,
            "the rows hold 1 tokens, the header announces 2",
        );
        let mut negative = body.clone();
        negative[3] = -5;
        refused(&header, &negative, "negative row length");
        let mut offset = body.clone();
        offset[1] = -1;
        refused(&header, &offset, "negative offset");
        let mut form = body.clone();
        form[2] = 9;
        refused(&header, &form, "unknown row form 9");
        let mut token = body.clone();
        token[4] = -3;
        refused(&header, &token, "negative token");
    }

    #[test]
    fn taps_out_of_order_are_refused() {
        let command = |taps: Vec<i32>| ([MAGIC, FORWARD, 0, 0, taps.len() as i32, 0, 0], taps);
        let (h, b) = command(vec![4, 4]);
        refused(&h, &b, "not ascending");
        let (h, b) = command(vec![5, 2]);
        refused(&h, &b, "not ascending");
        let (h, b) = command(vec![1, 2]);
        assert!(Command::decode(&h, &b).is_ok());
    }

    #[test]
    fn a_command_past_the_limits_is_not_encoded() {
        let too_long = Command::Forward {
            rows: vec![RowCommand {
                set: 0,
                offset: 0,
                form: RowForm::Prefill,
                tokens: vec![1; MAX_TOKENS + 1],
            }],
            taps: vec![],
            freed: vec![],
            copies: vec![],
        };
        assert!(too_long.encode().is_err());
    }

    #[test]
    fn taps_below_counts_lower_layers() {
        assert_eq!(taps_below(&[1, 4, 9], 4), 1);
        assert_eq!(taps_below(&[1, 4, 9], 10), 3);
        assert_eq!(taps_below(&[], 10), 0);
    }
}
