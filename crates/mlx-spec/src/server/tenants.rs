//! Per-tenant admission: at most `--max-concurrency-per-key` requests of
//! one API key in flight or queued at once, so one key cannot take every
//! slot of `--max-concurrency`. A request holds its [`KeySlot`] until it
//! ends or its client goes away (`worker::CancelOnDrop`); dropping the
//! slot frees it.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// The per-tenant counters and their limit.
#[derive(Debug, Clone)]
pub struct PerKeySlots {
    limit: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One request's place in its tenant's count.
#[derive(Debug)]
pub struct KeySlot {
    tenant: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl PerKeySlots {
    /// At most `limit` requests per tenant (at least 1).
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            held: Arc::default(),
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for a request of `tenant`; `None` when the tenant already
    /// holds `limit`.
    pub fn try_take(&self, tenant: &str) -> Option<KeySlot> {
        let mut held = self.held.lock();
        let count = held.entry(tenant.to_owned()).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(KeySlot {
            tenant: tenant.to_owned(),
            held: Arc::clone(&self.held),
        })
    }

    /// Requests `tenant` holds now.
    #[cfg(test)]
    pub fn held(&self, tenant: &str) -> usize {
        self.held.lock().get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(count) = held.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_cannot_take_more_than_its_limit() {
        let slots = PerKeySlots::new(2);
        let a1 = slots.try_take("key-1").expect("first");
        let a2 = slots.try_take("key-1").expect("second");
        assert!(slots.try_take("key-1").is_none(), "third refused");
        let b1 = slots.try_take("key-2").expect("another key is not held up");
        assert_eq!((slots.held("key-1"), slots.held("key-2")), (2, 1));
        drop(a1);
        let a3 = slots
            .try_take("key-1")
            .expect("a freed place is taken again");
        drop((a2, a3, b1));
        assert_eq!((slots.held("key-1"), slots.held("key-2")), (0, 0));
        assert!(slots.held.lock().is_empty(), "no entry left behind");
    }
}
