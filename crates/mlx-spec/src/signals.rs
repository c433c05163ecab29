//! SIGINT and SIGTERM watched on a thread of their own (a small `tokio`
//! runtime): once watched, a signal no longer ends the process by default;
//! the command decides what it does.

use std::ops::ControlFlow;

pub use tokio::signal::unix::SignalKind;

/// Calls `on_signal` with each signal of `kinds` the process gets, on the
/// thread `name`, until it breaks; returns once they are watched. Where a
/// signal cannot be watched it says so (a warning) and its default action
/// stays.
pub fn watch<F>(name: &str, kinds: &[SignalKind], mut on_signal: F)
where
    F: FnMut(SignalKind) -> ControlFlow<()> + Send + 'static,
{
    let kinds = kinds.to_vec();
    let (ready_tx, ready) = std::sync::mpsc::sync_channel(1);
    let watcher = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch for signals");
                    return;
                }
            };
            runtime.block_on(async {
                let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
                for &kind in &kinds {
                    match tokio::signal::unix::signal(kind) {
                        Ok(mut stream) => {
                            let tx = tx.clone();
                            tokio::spawn(async move {
                                while stream.recv().await.is_some() && tx.send(kind).is_ok() {}
                            });
                        }
                        Err(e) => tracing::warn!(error = %e, ?kind, "cannot watch for a signal"),
                    }
                }
                drop(tx);
                let _ = ready_tx.send(());
                while let Some(kind) = received.recv().await {
                    if on_signal(kind).is_break() {
                        return;
                    }
                }
            });
        });
    match watcher {
        // Returns when the handlers are in place, or the thread gave up.
        Ok(_) => {
            let _ = ready.recv();
        }
        Err(e) => tracing::warn!(error = %e, "cannot watch for signals"),
    }
}
