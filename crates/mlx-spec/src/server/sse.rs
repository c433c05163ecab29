//! Server-sent events: a relay task writes events into a [`Sink`]; when
//! the client goes away the response drops its receiver, the relay sees
//! its sink closed and ends, and whatever it holds (a generation, whose
//! guard cancels the request) goes with it: the engine frees the row
//! within one step.

use std::convert::Infallible;
use std::future::Future;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// Where a relay writes its events.
pub struct Sink(mpsc::Sender<Event>);

impl Sink {
    /// Sends a `data:` line; `false` when the client has gone.
    pub async fn data(&self, data: String) -> bool {
        self.0.send(Event::default().data(data)).await.is_ok()
    }

    /// Sends an event with a name (`event:`) and its data; `false` when
    /// the client has gone.
    pub async fn event(&self, name: &str, data: String) -> bool {
        self.0
            .send(Event::default().event(name).data(data))
            .await
            .is_ok()
    }

    /// Resolves when the client has gone.
    pub async fn closed(&self) {
        self.0.closed().await;
    }
}

/// The streamed response whose events `relay` writes, on a task of its
/// own.
pub fn respond<F, Fut>(relay: F) -> Response
where
    F: FnOnce(Sink) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(relay(Sink(tx)));
    let stream = ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    Sse::new(stream).into_response()
}
