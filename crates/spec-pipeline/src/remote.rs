//! The head's handle on the followers' copy of a request's caches: the last
//! cache of every set a pipeline target makes. Dropping the set queues its
//! id, and the next command tells the followers to free their copy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mlx_rs::Array;
use spec_core::{LayerCache, SpecError};

/// Cache-set ids dropped on the head, not yet announced to the followers.
pub(crate) type Freed = Arc<Mutex<Vec<u32>>>;

/// The marker cache naming a set on the followers.
#[derive(Debug)]
pub(crate) struct RemoteSet {
    pub id: u32,
    /// The local caches' offset after the last forward or trim (set
    /// through a shared reference: the handle sits in a `dyn LayerCache`).
    offset: AtomicUsize,
    freed: Freed,
}

impl RemoteSet {
    pub fn new(id: u32, freed: Freed) -> Self {
        Self {
            id,
            offset: AtomicUsize::new(0),
            freed,
        }
    }

    /// Levels the handle with the local caches after a forward.
    pub fn set_offset(&self, offset: usize) {
        self.offset.store(offset, Ordering::Relaxed);
    }
}

impl Drop for RemoteSet {
    fn drop(&mut self) {
        // A poisoned list only loses the announcement: the followers then
        // keep the set until they exit.
        if let Ok(mut freed) = self.freed.lock() {
            freed.push(self.id);
        }
    }
}

impl LayerCache for RemoteSet {
    fn offset(&self) -> usize {
        self.offset.load(Ordering::Relaxed)
    }

    fn update_and_fetch(
        &mut self,
        _keys: &Array,
        _values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        Err(SpecError::Invalid(
            "the handle of a pipeline's remote caches holds no keys".into(),
        ))
    }

    /// The followers' caches trim when the next command carries the lower
    /// offset; whether they can is the head's own caches' answer (every
    /// rank holds the same kinds of caches).
    fn can_trim(&self, n: usize) -> bool {
        n <= self.offset()
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        let have = self.offset();
        let left = have.checked_sub(n).ok_or_else(|| SpecError::Trim {
            requested: n,
            reason: format!("the remote caches hold {have} tokens"),
        })?;
        self.set_offset(left);
        Ok(())
    }

    fn nbytes(&self) -> usize {
        0
    }

    fn contents(&self) -> Option<(Array, Array)> {
        None
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
