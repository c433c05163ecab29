//! The providers the engine builds for requests' own options: a fixed
//! number of slots, filled through a shared reference while the scheduler
//! borrows them, emptied (least recently used first) only between
//! scheduler lifetimes, when no request holds one.

use std::cell::{Cell, OnceCell};

use spec_core::{DraftProvider, ProviderOptions};

/// A provider built for `(id, options)`.
pub(crate) struct Built {
    id: String,
    options: ProviderOptions,
    provider: Box<dyn DraftProvider>,
    used: Cell<u64>,
}

/// The slots and a use clock.
pub(crate) struct ProviderSlots {
    slots: Vec<OnceCell<Built>>,
    clock: Cell<u64>,
}

impl ProviderSlots {
    /// `capacity` empty slots.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            slots: (0..capacity).map(|_| OnceCell::new()).collect(),
            clock: Cell::new(0),
        }
    }

    fn touch(&self, built: &Built) {
        self.clock.set(self.clock.get() + 1);
        built.used.set(self.clock.get());
    }

    /// The provider built for `(id, options)`, if kept.
    pub(crate) fn find(&self, id: &str, options: &ProviderOptions) -> Option<&dyn DraftProvider> {
        let built = self
            .slots
            .iter()
            .filter_map(OnceCell::get)
            .find(|b| b.id == id && &b.options == options)?;
        self.touch(built);
        Some(built.provider.as_ref())
    }

    /// Whether a slot is empty.
    pub(crate) fn has_room(&self) -> bool {
        self.slots.iter().any(|s| s.get().is_none())
    }

    /// Keeps `provider` in an empty slot; gives it back when all are full.
    pub(crate) fn insert(
        &self,
        id: &str,
        options: &ProviderOptions,
        provider: Box<dyn DraftProvider>,
    ) -> Result<&dyn DraftProvider, Box<dyn DraftProvider>> {
        let Some(slot) = self.slots.iter().find(|s| s.get().is_none()) else {
            return Err(provider);
        };
        let built = slot.get_or_init(|| Built {
            id: id.to_owned(),
            options: options.clone(),
            provider,
            used: Cell::new(0),
        });
        self.touch(built);
        tracing::debug!(id, "per-request provider built and kept");
        Ok(built.provider.as_ref())
    }

    /// Drops the least recently used provider (none when all are empty).
    pub(crate) fn evict_least_recent(&mut self) {
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|b| (b.used.get(), i)))
            .min()
            .map(|(_, i)| i);
        if let Some(slot) = oldest.and_then(|i| self.slots.get_mut(i)) {
            if let Some(gone) = slot.take() {
                tracing::debug!(id = gone.id, "per-request provider dropped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use spec_core::{DraftSource, SpecError, Target};

    use super::*;

    struct Named(&'static str);

    impl DraftProvider for Named {
        fn id(&self) -> &str {
            self.0
        }
        fn open<'a>(&'a self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
            Err(SpecError::Invalid("never opened".into()))
        }
    }

    fn options(n: u32) -> ProviderOptions {
        ProviderOptions::from([("n", n.to_string().as_str())])
    }

    #[test]
    fn kept_by_id_and_options_least_recent_evicted() {
        let mut slots = ProviderSlots::new(2);
        assert!(slots.find("a", &options(1)).is_none());
        let first = slots.insert("a", &options(1), Box::new(Named("a1")));
        assert_eq!(first.ok().map(|p| p.id().to_owned()), Some("a1".into()));
        assert!(slots
            .insert("a", &options(2), Box::new(Named("a2")))
            .is_ok());
        assert!(!slots.has_room());
        let refused = slots.insert("b", &options(1), Box::new(Named("b1")));
        assert_eq!(refused.err().map(|p| p.id().to_owned()), Some("b1".into()));
        assert_eq!(slots.find("a", &options(1)).map(|p| p.id()), Some("a1"));
        assert!(slots.find("b", &options(1)).is_none(), "ids differ");
        // ("a", 2) is now the least recently used.
        slots.evict_least_recent();
        assert!(slots.has_room());
        assert!(slots.find("a", &options(2)).is_none());
        assert!(slots.find("a", &options(1)).is_some());
    }

    #[test]
    fn no_slots_keeps_nothing() {
        let mut slots = ProviderSlots::new(0);
        assert!(!slots.has_room());
        assert!(slots
            .insert("a", &options(1), Box::new(Named("a")))
            .is_err());
        slots.evict_least_recent();
    }
}
