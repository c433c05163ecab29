//! Providers built for per-request options, kept for the next request with
//! the same provider and options: a provider's cross-request state (the
//! `suffix` global tree) then survives, and a drafter model is not
//! reloaded per request. Bounded: the least recently used goes first.

use std::collections::VecDeque;
use std::rc::Rc;

use spec_core::{DraftProvider, ProviderOptions};

/// Distinct (provider, options) pairs kept at once: each may hold a drafter
/// model or a global tree (up to `max_tree_tokens` tokens).
pub const CAPACITY: usize = 4;

/// The cache, most recently used last.
#[derive(Default)]
pub struct ProviderCache {
    entries: VecDeque<(String, ProviderOptions, Rc<dyn DraftProvider>)>,
}

impl ProviderCache {
    /// The provider `id` built with `options`: the cached one, else
    /// `build`'s (cached, evicting the least recently used past
    /// [`CAPACITY`]). A failed build caches nothing.
    pub fn get_or_build<E>(
        &mut self,
        id: &str,
        options: &ProviderOptions,
        build: impl FnOnce() -> Result<Box<dyn DraftProvider>, E>,
    ) -> Result<Rc<dyn DraftProvider>, E> {
        if let Some(at) = self
            .entries
            .iter()
            .position(|(i, o, _)| i == id && o == options)
        {
            if let Some(entry) = self.entries.remove(at) {
                let provider = Rc::clone(&entry.2);
                self.entries.push_back(entry);
                return Ok(provider);
            }
        }
        let provider: Rc<dyn DraftProvider> = Rc::from(build()?);
        if self.entries.len() == CAPACITY {
            self.entries.pop_front();
        }
        self.entries
            .push_back((id.to_owned(), options.clone(), Rc::clone(&provider)));
        tracing::debug!(
            id,
            cached = self.entries.len(),
            "per-request provider built"
        );
        Ok(provider)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use spec_core::{DraftSource, SpecError, Target};

    use super::*;

    struct Dummy;

    impl DraftProvider for Dummy {
        fn id(&self) -> &str {
            "dummy"
        }
        fn open<'a>(&'a self, _: &'a dyn Target) -> Result<Box<dyn DraftSource + 'a>, SpecError> {
            Err(SpecError::Invalid("never opened".into()))
        }
    }

    #[test]
    fn one_provider_per_distinct_options_least_recently_used_evicted() {
        let builds = Cell::new(0);
        let mut cache = ProviderCache::default();
        let mut get = |id: &str, n: usize| {
            let options = ProviderOptions::from([("n", n.to_string().as_str())]);
            cache
                .get_or_build(id, &options, || {
                    builds.set(builds.get() + 1);
                    Ok::<Box<dyn DraftProvider>, ()>(Box::new(Dummy))
                })
                .expect("built")
        };
        let first = get("a", 1);
        assert!(Rc::ptr_eq(&first, &get("a", 1)), "the same instance");
        assert_eq!(builds.get(), 1);
        get("b", 1);
        assert_eq!(builds.get(), 2, "another provider id");
        assert!(Rc::ptr_eq(&first, &get("a", 1)));
        for n in 2..=CAPACITY {
            get("a", n);
        }
        assert_eq!(builds.get(), CAPACITY + 1);
        // ("a", 1) was used after ("b", 1): ("b", 1) went first.
        assert!(Rc::ptr_eq(&first, &get("a", 1)));
        assert_eq!(builds.get(), CAPACITY + 1);
        get("b", 1);
        assert_eq!(builds.get(), CAPACITY + 2, "evicted, built again");
        let failed = cache.get_or_build("c", &ProviderOptions::new(), || Err("no"));
        assert_eq!(failed.err(), Some("no"));
    }
}
