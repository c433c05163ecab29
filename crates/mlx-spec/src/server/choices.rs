//! A request's several choices (`n`; a completions request's list of
//! prompts): each runs as its own generation on the engine (its own batch
//! row), and their events are merged as they come, each tagged with its
//! choice's index. A choice's task ends with its events or when the
//! merged receiver goes away (the client left); either way it drops its
//! generation, which cancels the request on the engine.

use std::future::Future;

use tokio::sync::mpsc;

use super::chat_turn::{TurnEvent, TurnStream};
use super::generation::{Generation, Step};

/// The most choices one request may ask for (`n`, or prompts times `n`).
pub const MAX_CHOICES: usize = 64;

/// A running choice: its events, ending after its last.
pub trait Choice: Send + 'static {
    type Event: Send + 'static;
    fn next_event(&mut self) -> impl Future<Output = Option<Self::Event>> + Send + '_;
}

impl Choice for Generation {
    type Event = Step;
    fn next_event(&mut self) -> impl Future<Output = Option<Step>> + Send + '_ {
        self.next()
    }
}

impl Choice for TurnStream {
    type Event = TurnEvent;
    fn next_event(&mut self) -> impl Future<Output = Option<TurnEvent>> + Send + '_ {
        self.recv()
    }
}

/// Every choice's events on one receiver, as `(index, event)`; it ends
/// once every choice has ended.
pub fn fan_in<C: Choice>(choices: Vec<C>) -> mpsc::UnboundedReceiver<(usize, C::Event)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (index, mut choice) in choices.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = choice.next_event() => event,
                    () = tx.closed() => return,
                };
                let Some(event) = event else { return };
                if tx.send((index, event)).is_err() {
                    return;
                }
            }
        });
    }
    rx
}
