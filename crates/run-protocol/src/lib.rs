//! The protocol between the gates' run binaries (examples of the engine's
//! crates, which link MLX) and `xtask` (which does not): for each binary,
//! the typed request it reads and the typed report it writes. Both sides use
//! these types, so a renamed or retyped field fails the build, not a gate
//! run.
//!
//! The convention, the same for every binary:
//!
//! - the binary takes one argument, the path of a JSON file holding its
//!   request ([`Request`]); xtask writes that file (pretty-printed, one field
//!   a line) under the gate's work directory, so a failed run can be rerun
//!   by hand on the same file;
//! - it writes its report, the request's [`Request::Report`], as JSON to
//!   standard output and nothing else there (logs go to standard error);
//! - bulk numbers (logits, tensors, hidden states) go to files whose paths
//!   the request names.
//!
//! A request that does not parse fails with the binary's name, the file, and
//! the line holding the bad field ([`Error`]); requests refuse unknown
//! fields.
//!
//! [`providers`] is the one list of the draft providers the gates run.

#![warn(missing_docs)]

use std::ffi::OsString;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub mod assistant;
pub mod dflash;
pub mod dspark;
pub mod eagle3;
pub mod gguf;
pub mod greedy;
pub mod invariance;
pub mod mtp;
pub mod prompt_cache;
pub mod providers;
pub mod spec;
pub mod structured;
pub mod suffix;
pub mod timing;

/// A run binary's request: what it reads from the file named by its one
/// argument.
pub trait Request: Serialize + DeserializeOwned {
    /// The example binary that serves this request.
    const BINARY: &'static str;
    /// What the binary writes to standard output.
    type Report: Serialize + DeserializeOwned;
}

/// How a model's weights are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// Floating-point weights converted to float32.
    F32,
    /// Weights as the file stores them (quantized ones kept packed).
    Keep,
}

impl Dtype {
    /// The name a provider's `dtype` option takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Keep => "keep",
        }
    }
}

/// Where a mixture-of-experts target's experts live (what `generate
/// [--expert-cache-bytes B] [--mtp-expert-bits 8]` loads); the default: all
/// resident, as stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertOptions {
    /// Stream the routed experts from disk through a resident tier of this
    /// many bytes (`--expert-cache-bytes`); `None`: all resident.
    #[serde(default)]
    pub cache_bytes: Option<usize>,
    /// The MTP row's experts kept resident at this many bits
    /// (`--mtp-expert-bits`); `None`: as stored.
    #[serde(default)]
    pub mtp_expert_bits: Option<i32>,
}

/// What the streamed-expert tier did during one run (differences of its
/// counters, `ExpertStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertReads {
    /// Experts a forward found resident.
    pub hits: u64,
    /// Experts read from disk.
    pub misses: u64,
    /// Bytes read from the checkpoint's shards.
    pub bytes_read: u64,
    /// Seconds spent reading (and converting) them.
    pub read_seconds: f64,
}

/// A request or report that could not be read or written.
#[derive(Debug)]
pub enum Error {
    /// The binary was not given exactly one argument.
    Usage {
        /// The binary's name.
        binary: &'static str,
        /// The arguments it was given.
        args: Vec<OsString>,
    },
    /// The request file could not be read.
    Read {
        /// The binary's name.
        binary: &'static str,
        /// The request file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A request or report is not the binary's JSON.
    Parse {
        /// The binary's name.
        binary: &'static str,
        /// `request` or `report`.
        what: &'static str,
        /// Where it was read from.
        origin: String,
        /// The line serde stopped at, trimmed (it names the field).
        line: String,
        /// What serde said.
        source: serde_json::Error,
    },
    /// The report could not be written.
    Write {
        /// The binary's name.
        binary: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage { binary, args } => write!(
                f,
                "{binary}: expected one argument, the path of its JSON request, got {args:?}"
            ),
            Error::Read { binary, path, .. } => {
                write!(f, "{binary}: cannot read the request {}", path.display())
            }
            Error::Parse {
                binary,
                what,
                origin,
                line,
                ..
            } => {
                write!(f, "{binary}: cannot parse the {what} {origin}")?;
                if !line.is_empty() {
                    write!(f, " at `{line}`")?;
                }
                Ok(())
            }
            Error::Write { binary, .. } => write!(f, "{binary}: cannot write the report"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Usage { .. } => None,
            Error::Read { source, .. } | Error::Write { source, .. } => Some(source),
            Error::Parse { source, .. } => Some(source),
        }
    }
}

/// Parses JSON `text` as `T`; on failure the error quotes the line serde
/// stopped at.
fn parse<T: DeserializeOwned>(
    binary: &'static str,
    what: &'static str,
    origin: &str,
    text: &str,
) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|source| Error::Parse {
        binary,
        what,
        origin: origin.to_owned(),
        line: text
            .lines()
            .nth(source.line().saturating_sub(1))
            .unwrap_or_default()
            .trim()
            .chars()
            .take(200)
            .collect(),
        source,
    })
}

/// The binary side: reads the request from the file named by the process's
/// one argument.
pub fn read_request<R: Request>() -> Result<R, Error> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let [path] = args.as_slice() else {
        return Err(Error::Usage {
            binary: R::BINARY,
            args,
        });
    };
    read_request_file(Path::new(path))
}

/// Reads a request from `path`.
pub fn read_request_file<R: Request>(path: &Path) -> Result<R, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        binary: R::BINARY,
        path: path.to_owned(),
        source,
    })?;
    parse_request(&path.display().to_string(), &text)
}

/// Parses a request read from `origin`.
pub fn parse_request<R: Request>(origin: &str, text: &str) -> Result<R, Error> {
    parse(R::BINARY, "request", origin, text)
}

/// The request as its file holds it (pretty-printed: one field a line, so a
/// parse error's line names the field).
pub fn request_json<R: Request>(request: &R) -> String {
    // Serializing these types cannot fail: no maps with non-string keys, no
    // failing `Serialize` impls.
    serde_json::to_string_pretty(request).unwrap_or_default()
}

/// The binary side: writes `report` to standard output.
pub fn write_report<R: Request>(report: &R::Report) -> Result<(), Error> {
    let text = report_json::<R>(report);
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|source| Error::Write {
            binary: R::BINARY,
            source,
        })
}

/// A report as the binary writes it.
pub fn report_json<R: Request>(report: &R::Report) -> String {
    serde_json::to_string_pretty(report).unwrap_or_default()
}

/// The xtask side: parses what the binary wrote (`origin` says where it was
/// saved).
pub fn parse_report<R: Request>(origin: &str, text: &str) -> Result<R::Report, Error> {
    parse(R::BINARY, "report", origin, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariance::InvarianceRequest;

    fn request() -> InvarianceRequest {
        InvarianceRequest {
            model: "/m".into(),
            dtype: Dtype::Keep,
            prompt_len: 70,
            rows: 33,
            bits: "/w/rows.bin".into(),
        }
    }

    #[test]
    fn requests_round_trip_through_their_file_form() {
        let text = request_json(&request());
        assert!(text.contains("\n  \"rows\": 33,"), "{text}");
        let back: InvarianceRequest = parse_request("f.json", &text).expect("parses");
        assert_eq!(back, request());
    }

    #[test]
    fn a_bad_field_is_named_with_the_binary() {
        let text = request_json(&request()).replace("\"rows\": 33", "\"rows\": \"33\"");
        let e = parse_request::<InvarianceRequest>("f.json", &text).expect_err("bad type");
        assert_eq!(
            e.to_string(),
            "invariance_run: cannot parse the request f.json at `\"rows\": \"33\",`"
        );

        let text = request_json(&request()).replace("\"rows\"", "\"row\"");
        let e = parse_request::<InvarianceRequest>("f.json", &text).expect_err("unknown field");
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        assert!(
            cause
                .as_deref()
                .is_some_and(|c| c.contains("unknown field `row`")),
            "{cause:?}"
        );
    }

    #[test]
    fn a_missing_argument_is_a_usage_error() {
        let e = Error::Usage {
            binary: "spec_run",
            args: Vec::new(),
        };
        assert!(e.to_string().contains("one argument"), "{e}");
    }
}

/// A quantized KV cache's bits and group size (mlx-lm's `kv_bits`,
/// `kv_group_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCacheBits {
    /// Bits per element.
    pub bits: i32,
    /// Elements of the head dimension per scale and bias.
    pub group_size: i32,
    /// The first position whose queries read the quantized keys (mlx-lm's
    /// `quantized_kv_start`); 0: every position.
    #[serde(default)]
    pub start: usize,
}
