//! Joining a group: `mx.distributed.init` with a bounded wait.

use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{ffi, Backend, DistError, Group, Hostfile};

/// How to join.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// The backend.
    pub backend: Backend,
    /// Fail when the backend cannot form a group (otherwise MLX falls back
    /// to a group of this process alone).
    pub strict: bool,
    /// Longest wait for the peers to join.
    pub timeout: Duration,
}

impl InitOptions {
    /// Strict, waiting at most 60 s for the peers.
    pub fn new(backend: Backend) -> Self {
        Self {
            backend,
            strict: true,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Whether this MLX build has `backend` (for `Any`: any backend).
pub fn is_available(backend: Backend) -> bool {
    ffi::is_available(backend)
}

/// Joins the group `options` describe.
///
/// With the ring backend (and with `Any` when `MLX_HOSTFILE` is set), the
/// hostfile and rank are checked first, so a malformed setting is a
/// [`DistError::Hostfile`] rather than a hang. MLX's initialisation blocks
/// until every neighbour has connected and cannot be cancelled, so it runs on
/// a helper thread: after `timeout` this returns [`DistError::Timeout`]
/// naming the peers that are not listening, and the helper thread stays
/// blocked; the process should then exit.
pub fn init(options: &InitOptions) -> Result<Group, DistError> {
    let backend = options.backend;
    let ring = match backend {
        Backend::Ring => Some(Hostfile::from_env()?),
        Backend::Any if std::env::var_os(crate::HOSTFILE_ENV).is_some() => {
            Some(Hostfile::from_env()?)
        }
        _ => None,
    };
    if options.strict && !ffi::is_available(backend) {
        return Err(DistError::Unavailable { backend });
    }
    let strict = options.strict;
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::Builder::new()
        .name(format!("mlx-distributed-init-{backend}"))
        .spawn(move || {
            // The receiver may be gone after a timeout; nothing to do then.
            let _ = tx.send(ffi::init(backend, strict));
        })
        .map_err(|source| DistError::Io {
            what: "distributed `init` failed: cannot start the initialisation thread".into(),
            source,
        })?;
    match rx.recv_timeout(options.timeout) {
        Ok(Ok(raw)) => {
            let group = Group::new(raw, backend);
            tracing::info!(
                backend = %backend,
                rank = group.rank(),
                size = group.size(),
                seconds = started.elapsed().as_secs_f64(),
                "joined the distributed group"
            );
            Ok(group)
        }
        Ok(Err(status)) => Err(DistError::Init { backend, status }),
        Err(_) => {
            let (rank, peers) = match &ring {
                Some((file, rank, _)) => (*rank, silent_peers(file, *rank)),
                None => (0, "the backend gives no peer list to check".to_string()),
            };
            Err(DistError::Timeout {
                backend,
                rank,
                waited: options.timeout,
                peers,
            })
        }
    }
}

/// Which peers of a ring are not listening on their addresses (a refused or
/// timed-out connection), described for an error.
fn silent_peers(file: &Hostfile, me: usize) -> String {
    let silent: Vec<String> = file
        .ranks
        .iter()
        .enumerate()
        .filter(|(rank, _)| *rank != me)
        .filter(|(_, addrs)| !addrs.iter().all(listening))
        .map(|(rank, addrs)| format!("rank {rank} ({})", addrs[0]))
        .collect();
    if silent.is_empty() {
        "every peer listens, but the group did not form".to_string()
    } else {
        format!("not listening: {}", silent.join(", "))
    }
}

fn listening(addr: &SocketAddr) -> bool {
    TcpStream::connect_timeout(addr, Duration::from_millis(300)).is_ok()
}
