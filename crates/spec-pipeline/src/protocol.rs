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

    /// The body length a header announces.
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
            SHUTDOWN => Ok(0),
            FORWARD => Ok(4 * uint(*rows, "rows")?
                + uint(*tokens, "tokens")?
                + uint(*taps, "taps")?
                + uint(*freed, "freed sets")?
                + 2 * uint(*copies, "copied sets")?),
            other => Err(PipelineError::Protocol(format!(
                "unknown command kind {other}"
            ))),
        }
    }

    /// Reads a command back from its header and body.
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
        let (n, ntaps) = (uint(header[2], "rows")?, uint(header[4], "taps")?);
        let (meta, rest) = body.split_at(4 * n);
        let mut at = 0;
        let mut rows = Vec::with_capacity(n);
        for m in meta.chunks_exact(4) {
            let len = uint(m[3], "row length")?;
            let tokens = rest
                .get(at..at + len)
                .ok_or_else(|| PipelineError::Protocol("row tokens past the body".into()))?;
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
                tokens: tokens.iter().map(|&t| t as u32).collect(),
            });
        }
        if at != uint(header[3], "tokens")? {
            return Err(PipelineError::Protocol(format!(
                "the rows hold {at} tokens, the header announces {}",
                header[3]
            )));
        }
        let taps = rest[at..at + ntaps]
            .iter()
            .map(|&t| uint(t, "tap"))
            .collect::<Result<_, _>>()?;
        let nfreed = uint(header[5], "freed sets")?;
        let (freed, copies) = rest[at + ntaps..].split_at(nfreed);
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

    #[test]
    fn foreign_or_truncated_messages_are_errors() {
        assert!(Command::body_len(&[1, 1, 0, 0, 0, 0, 0]).is_err());
        assert!(Command::body_len(&[MAGIC, 7, 0, 0, 0, 0, 0]).is_err());
        assert!(Command::body_len(&[MAGIC, FORWARD, -1, 0, 0, 0, 0]).is_err());
        assert!(Command::body_len(&[MAGIC, FORWARD, 0, 0, 0, 0, -1]).is_err());
        let (header, mut body) = Command::Forward {
            rows: vec![RowCommand {
                set: 0,
                offset: 0,
                form: RowForm::Prefill,
                tokens: vec![1, 2],
            }],
            taps: vec![],
            freed: vec![],
            copies: vec![],
        }
        .encode()
        .expect("protocol");
        body.pop();
        assert!(Command::decode(&header, &body).is_err());
    }

    #[test]
    fn taps_below_counts_lower_layers() {
        assert_eq!(taps_below(&[1, 4, 9], 4), 1);
        assert_eq!(taps_below(&[1, 4, 9], 10), 3);
        assert_eq!(taps_below(&[], 10), 0);
    }
}
