//! Errors of the distributed layer.

use std::path::PathBuf;
use std::time::Duration;

use crate::Backend;

/// What went wrong joining a group or communicating.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A backend name MLX does not know.
    #[error("unknown distributed backend `{0}` (known: any, ring, mpi, jaccl, nccl)")]
    UnknownBackend(String),
    /// The backend is not part of this MLX build or cannot load.
    #[error("the `{backend}` distributed backend is not available in this MLX build")]
    Unavailable {
        /// The backend asked for.
        backend: Backend,
    },
    /// `MLX_RANK` / `MLX_HOSTFILE` missing or malformed, or the hostfile
    /// unreadable or wrong.
    #[error("ring hostfile {}: {reason}", path.as_ref().map_or_else(|| "(none)".to_string(), |p| p.display().to_string()))]
    Hostfile {
        /// The file, when one was named.
        path: Option<PathBuf>,
        /// What is wrong with it.
        reason: String,
    },
    /// A hostfile is not JSON; the parser's error is the `source()`.
    #[error("ring hostfile {}: not JSON: {source}", path.as_ref().map_or_else(|| "(none)".to_string(), |p| p.display().to_string()))]
    HostfileJson {
        /// The file, when one was named.
        path: Option<PathBuf>,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// An OS operation failed (reading or writing a hostfile, binding a
    /// port, starting a thread); the OS error is the `source()`.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the file or rank.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// MLX refused to initialise the backend.
    #[error("initialising the `{backend}` backend failed (MLX status {status})")]
    Init {
        /// The backend asked for.
        backend: Backend,
        /// MLX's status code.
        status: i32,
    },
    /// Initialisation did not complete in time: some peers never joined.
    #[error("rank {rank}: the `{backend}` group did not form within {waited:?}; {peers}")]
    Timeout {
        /// The backend asked for.
        backend: Backend,
        /// This process's rank.
        rank: usize,
        /// How long it waited.
        waited: Duration,
        /// Which peers were not reachable, as far as could be told.
        peers: String,
    },
    /// A group operation MLX refused (a split the backend cannot do, a rank
    /// out of range, an array the operation cannot take).
    #[error("distributed `{op}` failed: {reason}")]
    Op {
        /// The operation.
        op: &'static str,
        /// Why.
        reason: String,
    },
}
