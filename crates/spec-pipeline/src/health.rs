//! Whether a pipeline can still run. A failed exchange with a neighbour (a
//! rank that died, a lost connection) leaves the ranks at different places
//! in the protocol, so the first one breaks the pipeline for good: the head
//! refuses every later forward with it, and a host watching the pipeline
//! (the server) stops.

use std::sync::{Arc, OnceLock};

use crate::PipelineError;

/// A shared view of a pipeline's state: cloned out of the
/// [`PipelineTarget`](crate::PipelineTarget) to any thread.
#[derive(Debug, Clone, Default)]
pub struct PipelineHealth {
    broken: Arc<OnceLock<Arc<PipelineError>>>,
}

impl PipelineHealth {
    /// The failure that broke the pipeline; `None` while it runs.
    pub fn broken(&self) -> Option<Arc<PipelineError>> {
        self.broken.get().cloned()
    }

    /// Records `failure` unless an earlier one broke the pipeline already;
    /// returns the error to report: a later failure is a consequence of the
    /// first.
    pub(crate) fn mark(&self, failure: PipelineError) -> PipelineError {
        let first = self.broken.get_or_init(|| Arc::new(failure));
        PipelineError::Broken(Arc::clone(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_kept_and_reported_by_every_later_one() {
        let health = PipelineHealth::default();
        let watcher = health.clone();
        assert!(watcher.broken().is_none());
        let first = health.mark(PipelineError::Protocol("first".into()));
        let later = health.mark(PipelineError::Protocol("second".into()));
        for e in [first, later] {
            let text = e.to_string();
            assert!(text.contains("first") && !text.contains("second"), "{text}");
        }
        let seen = watcher.broken().expect("broken");
        assert_eq!(seen.to_string(), "pipeline protocol: first");
    }
}
