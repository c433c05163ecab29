//! The accept loop of `serve`: each connection served by hyper's HTTP/1
//! with a header-read timeout (which bounds idle keep-alive gaps too: the
//! timer runs while a connection waits for a request's head), a cap on
//! open connections (those past it are closed at once), and a drain on
//! stop bounded by a grace period, after which the connections left are
//! dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// The bounds on connections (`--header-timeout`, `--max-connections`,
/// `--shutdown-grace`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time a connection has to send a request's head, and the longest
    /// it may sit idle between requests.
    pub header_timeout: Duration,
    /// Connections open at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// Time the connections have to finish once `stop` resolves.
    pub shutdown_grace: Duration,
}

/// Serves `app` on `listener` until `stop` resolves, then drains the open
/// connections for at most `limits.shutdown_grace`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while tasks.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = limits.max_connections, "too many connections: closing a new one");
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut stop_rx = stop_rx.clone();
        tasks.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended");
                    }
                    return;
                }
                _ = stop_rx.changed() => conn.as_mut().graceful_shutdown(),
            }
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended while draining");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = tasks.len(),
            "the shutdown grace is over: closing the connections left"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}
