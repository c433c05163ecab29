//! Server-sent events: a relay task writes events into a [`Sink`]; when
//! the client goes away the response drops its receiver, the relay sees
//! its sink closed and ends, and whatever it holds (a generation, whose
//! guard cancels the request) goes with it: the engine frees the row
//! within one step. The named-event APIs (Anthropic's Messages, OpenAI's
//! Responses) relay their event machines through [`relay_named`].

use std::convert::Infallible;
use std::future::Future;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::api::ApiError;

/// A named event: its `event:` name and its `data:` JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    pub name: &'static str,
    pub data: serde_json::Value,
}

impl Named {
    pub fn new(name: &'static str, data: serde_json::Value) -> Self {
        Self { name, data }
    }
}

/// An API's events over a running answer.
pub trait NamedSource: Send + 'static {
    /// The events sent before any engine event.
    fn start(&mut self) -> Vec<Named>;
    /// The events of the next engine event; `None` once the answer ended.
    fn next(&mut self) -> impl Future<Output = Option<Result<Vec<Named>, ApiError>>> + Send;
    /// The event telling the client of a failure after the start; nothing
    /// follows it.
    fn failure(&mut self, e: &ApiError) -> Named;
}

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

    /// Sends a named event; `false` when the client has gone.
    pub async fn named(&self, event: &Named) -> bool {
        self.event(event.name, event.data.to_string()).await
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

/// The streamed response of `source`: its start, each engine event's
/// events while the client stays, a failure's event last. A client gone
/// drops the source (and the request it holds).
pub fn relay_named<S: NamedSource>(mut source: S) -> Response {
    respond(move |sink| async move {
        for event in source.start() {
            if !sink.named(&event).await {
                return;
            }
        }
        loop {
            let step = tokio::select! {
                step = source.next() => step,
                () = sink.closed() => return,
            };
            let events = match step {
                None => return,
                Some(Ok(events)) => events,
                Some(Err(e)) => {
                    let _ = sink.named(&source.failure(&e)).await;
                    return;
                }
            };
            for event in events {
                if !sink.named(&event).await {
                    return;
                }
            }
        }
    })
}
