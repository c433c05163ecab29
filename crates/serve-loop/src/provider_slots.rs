//! The providers the engine builds for requests' own options: a bounded
//! set, the least recently used dropped first to make room. Requests hold
//! the provider they were opened with, so one dropped from the set while
//! its requests run stays alive (retired) until the last of them ends:
//! its address, the key of its saved draft states in the prefix cache,
//! cannot be taken by a provider built later while those states exist.

use std::rc::Rc;

use spec_core::{DraftProvider, ProviderOptions};

/// A provider built for `(id, options)`.
struct Built {
    id: String,
    options: ProviderOptions,
    provider: Rc<dyn DraftProvider>,
    used: u64,
}

/// The kept providers, a use clock, and the retired ones.
pub(crate) struct ProviderSlots {
    kept: Vec<Built>,
    capacity: usize,
    clock: u64,
    /// Dropped from the set while requests still held them.
    retired: Vec<Rc<dyn DraftProvider>>,
}

impl ProviderSlots {
    /// Room for `capacity` providers (at least one is kept).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            kept: Vec::new(),
            capacity: capacity.max(1),
            clock: 0,
            retired: Vec::new(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The provider built for `(id, options)`, if kept.
    pub(crate) fn find(
        &mut self,
        id: &str,
        options: &ProviderOptions,
    ) -> Option<Rc<dyn DraftProvider>> {
        let now = self.tick();
        let built = self
            .kept
            .iter_mut()
            .find(|b| b.id == id && &b.options == options)?;
        built.used = now;
        Some(Rc::clone(&built.provider))
    }

    /// Keeps `provider` for `(id, options)`, dropping the least recently
    /// used one when the set is full (retired while requests hold it).
    pub(crate) fn insert(
        &mut self,
        id: &str,
        options: &ProviderOptions,
        provider: Box<dyn DraftProvider>,
    ) -> Rc<dyn DraftProvider> {
        if self.kept.len() >= self.capacity {
            let oldest = self
                .kept
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.used)
                .map(|(i, _)| i);
            if let Some(i) = oldest {
                let gone = self.kept.swap_remove(i);
                tracing::debug!(id = gone.id, "per-request provider dropped from the set");
                self.retired.push(gone.provider);
            }
        }
        let provider: Rc<dyn DraftProvider> = Rc::from(provider);
        let used = self.tick();
        self.kept.push(Built {
            id: id.to_owned(),
            options: options.clone(),
            provider: Rc::clone(&provider),
            used,
        });
        tracing::debug!(id, "per-request provider built and kept");
        provider
    }

    /// Retired providers no request holds any more, handed over to be
    /// dropped once their saved states are forgotten.
    pub(crate) fn take_released(&mut self) -> Vec<Rc<dyn DraftProvider>> {
        let (released, held) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|p| Rc::strong_count(p) == 1);
        self.retired = held;
        released
    }

    /// Providers kept and retired.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        (self.kept.len(), self.retired.len())
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
        fn open<'a>(&self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
            Err(SpecError::Internal("never opened"))
        }
    }

    fn options(n: u32) -> ProviderOptions {
        ProviderOptions::from([("n", n.to_string().as_str())])
    }

    #[test]
    fn kept_by_id_and_options_least_recent_dropped() {
        let mut slots = ProviderSlots::new(2);
        assert!(slots.find("a", &options(1)).is_none());
        let first = slots.insert("a", &options(1), Box::new(Named("a1")));
        assert_eq!(first.id(), "a1");
        drop(first);
        drop(slots.insert("a", &options(2), Box::new(Named("a2"))));
        assert_eq!(
            slots.find("a", &options(1)).map(|p| p.id().to_owned()),
            Some("a1".into())
        );
        assert!(slots.find("b", &options(1)).is_none(), "ids differ");
        // ("a", 2) is now the least recently used: a third one replaces it.
        drop(slots.insert("b", &options(1), Box::new(Named("b1"))));
        assert_eq!(slots.counts(), (2, 1));
        assert!(slots.find("a", &options(2)).is_none());
        assert!(slots.find("a", &options(1)).is_some());
        assert!(slots.find("b", &options(1)).is_some());
        // Nobody holds ("a", 2): it is released at once.
        let released = slots.take_released();
        assert_eq!(released.iter().map(|p| p.id()).collect::<Vec<_>>(), ["a2"]);
        assert_eq!(slots.counts(), (2, 0));
    }

    #[test]
    fn a_provider_held_by_a_request_stays_retired_until_let_go() {
        let mut slots = ProviderSlots::new(1);
        let held = slots.insert("a", &options(1), Box::new(Named("a1")));
        drop(slots.insert("a", &options(2), Box::new(Named("a2"))));
        assert_eq!(slots.counts(), (1, 1));
        assert!(slots.take_released().is_empty(), "a request still holds a1");
        assert!(
            slots.find("a", &options(1)).is_none(),
            "retired: never found"
        );
        drop(held);
        assert_eq!(slots.take_released().len(), 1);
        assert_eq!(slots.counts(), (1, 0));
    }
}
