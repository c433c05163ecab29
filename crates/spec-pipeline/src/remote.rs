//! The head's handle on the followers' copy of a request's caches: the last
//! cache of every set a pipeline target makes. Dropping the set queues its
//! id, and the next command tells the followers to free their copy;
//! duplicating it (the serve loop's prefix cache) takes a new id and queues
//! a copy, made by the followers before anything else in the next command.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mlx_rs::Array;
use spec_core::{LayerCache, SpecError};

/// What the head did to its sets since the last command.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// Sets dropped.
    pub freed: Vec<u32>,
    /// Sets duplicated: `(source, copy)`, in order.
    pub copies: Vec<(u32, u32)>,
}

/// The head's pending announcements and its next set id, shared by every
/// handle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sets {
    pub pending: Arc<Mutex<Pending>>,
    next: Arc<AtomicU32>,
}

impl Sets {
    /// A new set id.
    pub fn next_id(&self) -> u32 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes what is to be announced.
    pub fn take(&self) -> Pending {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }
}

/// The marker cache naming a set on the followers.
#[derive(Debug)]
pub(crate) struct RemoteSet {
    pub id: u32,
    /// The local caches' offset after the last forward or trim (set
    /// through a shared reference: the handle sits in a `dyn LayerCache`).
    offset: AtomicUsize,
    sets: Sets,
}

impl RemoteSet {
    pub fn new(id: u32, sets: Sets) -> Self {
        Self {
            id,
            offset: AtomicUsize::new(0),
            sets,
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
        if let Ok(mut pending) = self.sets.pending.lock() {
            pending.freed.push(self.id);
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
        Err(spec_core::InputError::ForeignCache(
            "the handle of a pipeline's remote caches holds no keys".into(),
        )
        .into())
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

    /// The followers' bytes are theirs: a prefix-cache budget counts the
    /// head's.
    fn nbytes(&self) -> usize {
        0
    }

    /// A new set whose followers' copy is made from this one's at the next
    /// command (the followers' set then holds what this one held after the
    /// last forward, and the copy's first row trims it to its offset).
    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        let copy = self.sets.next_id();
        self.sets.pending.lock().ok()?.copies.push((self.id, copy));
        let handle = RemoteSet::new(copy, self.sets.clone());
        handle.set_offset(self.offset());
        Some(Box::new(handle))
    }

    fn contents(&self) -> Option<(Array, Array)> {
        None
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
