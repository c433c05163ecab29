//! The in-memory prefix cache: target caches kept at exact boundaries,
//! keyed by the tokens they hold, reused by later requests that start with
//! the same tokens; bounded in bytes and entries, least recently used first
//! out.
//!
//! Exactness by construction ([`Boundaries`]): a hit is taken only at a
//! boundary `b` where the caches hold the bits a cold prefill of the new
//! prompt holds after its first `b` tokens.
//! - A split-invariant target ([`spec_core::Target::split_invariant`]: any
//!   split into prompt chunks and decoding windows gives one prefill's
//!   bits) takes any `b <= len-1`, and a request leaves an entry holding
//!   its prompt and the tokens it generated (caches trimmed to them).
//! - Any other target (GLM) keeps the prefill grid: prefill runs
//!   `prompt[..len-1]` in chunks of `chunk` tokens from the prompt's start,
//!   so the caches after `b` tokens are a cold prefill's bits when `b` is a
//!   grid point or that prompt's own `len-1`. Entries there are snapshots
//!   taken at such points during prefill (never after generation, whose
//!   verify windows split the tokens differently).
//!
//! Either way a longer entry serves a shorter boundary only where every
//! cache trims exactly (a rotated sliding window does not), and the entry
//! itself is never mutated.
//!
//! Entries live in partitions ([`cache_partition`]): a request sees only the
//! entries its own partition made. By default a request's partition is its
//! tenant and its `cache_salt`, so one tenant can never learn from a hit
//! (its `cached_tokens`, its time to first token) what another sent;
//! [`PrefixCacheConfig::share_tenants`] lets an operator share across
//! tenants (the salt still partitions).

use std::rc::Rc;

use spec_core::{CacheSet, DraftProvider, SavedDraft, Target};

/// Draft sources' saved states, by their provider's [`state_key`], kept
/// with an entry.
pub type SavedDrafts = Vec<(String, Rc<dyn SavedDraft>)>;

/// The key a provider's saved states are kept under: its id and address
/// (two providers of one id, built with other options, keep apart).
pub fn state_key(provider: &dyn DraftProvider) -> String {
    let at = provider as *const dyn DraftProvider as *const ();
    format!("{}@{at:p}", provider.id())
}

/// A usable cached prefix, as [`PrefixCache::lookup`] finds it.
#[derive(Debug)]
pub struct Hit {
    /// A copy of the target caches, holding `prompt[..tokens]`.
    pub caches: CacheSet,
    /// Prompt tokens they hold.
    pub tokens: usize,
    /// Draft sources' states saved by the request that made the entry
    /// (each covers its first [`SavedDraft::tokens`] tokens, which may be
    /// fewer or more than `tokens`).
    pub drafts: SavedDrafts,
}

/// Bytes the prefix cache may hold by default (1 GiB).
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 1 << 30;
/// Entries the prefix cache may hold by default.
pub const DEFAULT_PREFIX_CACHE_ENTRIES: usize = 32;

/// Bounds of the prefix cache; `max_bytes == 0` or `max_entries == 0`
/// turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Most bytes of cached caches (the sum of [`CacheSet::nbytes`]). The
    /// entries never hold more; an entry larger than this is not kept.
    pub max_bytes: usize,
    /// Most entries.
    pub max_entries: usize,
    /// Whether requests of different tenants share entries (off by
    /// default: each tenant has a partition of its own). A request's
    /// `cache_salt` partitions either way.
    pub share_tenants: bool,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            max_entries: DEFAULT_PREFIX_CACHE_ENTRIES,
            share_tenants: false,
        }
    }
}

/// The partition of a request of `tenant` with `salt` ("" when neither
/// applies: the shared partition). Distinct `(tenant, salt)` pairs give
/// distinct partitions (each part is length-prefixed), and the tenant is
/// left out when `share_tenants` is on.
pub fn cache_partition(tenant: Option<&str>, salt: Option<&str>, share_tenants: bool) -> String {
    let tenant = tenant.filter(|_| !share_tenants);
    let mut out = String::new();
    for (tag, part) in [("t", tenant), ("s", salt)] {
        if let Some(part) = part {
            out.push_str(&format!("{tag}{}:{part};", part.len()));
        }
    }
    out
}

impl PrefixCacheConfig {
    /// A cache that keeps nothing.
    pub fn off() -> Self {
        Self {
            max_bytes: 0,
            max_entries: 0,
            share_tenants: false,
        }
    }

    /// Whether it can keep anything.
    pub fn is_on(&self) -> bool {
        self.max_bytes > 0 && self.max_entries > 0
    }
}

/// Counters of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups that reused a cached prefix.
    pub hits: u64,
    /// Lookups that found nothing usable.
    pub misses: u64,
    /// Prompt tokens served from the cache over all hits.
    pub cached_tokens: u64,
    /// Bytes held now.
    pub bytes: usize,
    /// Entries held now.
    pub entries: usize,
    /// Entries dropped to stay within the bounds.
    pub evictions: u64,
    /// Requests whose draft source started from a saved state of a hit
    /// ([`spec_core::DraftSource::prefill_from`] took it).
    pub draft_restores: u64,
}

#[derive(Debug)]
struct Entry {
    /// The [`cache_partition`] of the request that made it.
    partition: String,
    tokens: Vec<u32>,
    caches: CacheSet,
    drafts: SavedDrafts,
    bytes: usize,
    last_used: u64,
}

/// Cached target caches keyed by the tokens they hold.
#[derive(Debug, Default)]
pub struct PrefixCache {
    config: PrefixCacheConfig,
    entries: Vec<Entry>,
    clock: u64,
    stats: PrefixCacheStats,
    store: Option<Box<dyn PrefixStore>>,
    /// `(state key, provider id)` of the providers whose saved states the
    /// store keeps (the host's own providers, which a restart builds
    /// again under the same ids).
    persisted: Vec<(String, String)>,
}

/// Where a target's caches may be reused: the boundaries `b` at which the
/// caches after `prompt[..b]` hold the bits of a cold prefill of `prompt`
/// (see the module docs). Always `0 < b <= len-1`: the last prompt token
/// runs in the request (it gives the first logits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundaries {
    /// Points of the prefill grid of this many tokens, and `len-1`.
    Grid(usize),
    /// Every token boundary (a split-invariant target).
    Any,
}

impl Boundaries {
    /// The rule for `target` prefilling in chunks of `chunk` tokens.
    pub fn of(target: &dyn Target, chunk: usize) -> Self {
        if target.split_invariant() {
            Boundaries::Any
        } else {
            Boundaries::Grid(chunk)
        }
    }

    /// Whether `b` is an exact boundary of a prompt of `prompt_len` tokens.
    pub fn exact(self, prompt_len: usize, b: usize) -> bool {
        let body = prompt_len.saturating_sub(1);
        b > 0
            && b <= body
            && match self {
                Boundaries::Any => true,
                Boundaries::Grid(chunk) => b == body || (chunk > 0 && b.is_multiple_of(chunk)),
            }
    }

    /// The longest exact boundary within the first `limit` tokens of an
    /// entry of `entry_len` tokens (0: none). Off the grid only the
    /// entry's own end counts: inside it, its rows came from a chunk that
    /// went on past `b`.
    fn within(self, prompt_len: usize, limit: usize, entry_len: usize) -> usize {
        let limit = limit.min(prompt_len.saturating_sub(1));
        match self {
            Boundaries::Any => limit,
            Boundaries::Grid(_) if limit == entry_len && self.exact(prompt_len, limit) => limit,
            Boundaries::Grid(chunk) => {
                let grid = limit / chunk.max(1) * chunk;
                if self.exact(prompt_len, grid) {
                    grid
                } else {
                    0
                }
            }
        }
    }

    /// Whether entries may hold generated tokens (their rows come from
    /// decoding windows).
    pub fn keeps_generated(self) -> bool {
        self == Boundaries::Any
    }

    /// A short name of the rule (`any`, `grid:512`), which a store records
    /// with each entry: an entry taken under one rule is exact under the
    /// same rule only.
    pub fn tag(self) -> String {
        match self {
            Boundaries::Any => "any".into(),
            Boundaries::Grid(chunk) => format!("grid:{chunk}"),
        }
    }
}

/// An entry a [`PrefixStore`] read back.
#[derive(Debug)]
pub struct StoredEntry {
    /// The [`cache_partition`] it was kept under.
    pub partition: String,
    /// The tokens its caches hold.
    pub tokens: Vec<u32>,
    /// The target caches.
    pub caches: CacheSet,
    /// Draft states read back by their provider
    /// ([`DraftProvider::load_saved`]), by provider id.
    pub drafts: Vec<(String, Box<dyn SavedDraft>)>,
}

/// Where prefix-cache entries persist beyond the process (the server's
/// `--prompt-cache-dir`); this crate knows no file format. Called on the
/// engine thread. A store's own failures (a full disk, an unreadable file)
/// are its to log: the in-memory cache goes on without them.
pub trait PrefixStore: std::fmt::Debug {
    /// The entries it holds that were taken under `rule` for this target,
    /// least recently used first, as caches of `target`, each with the
    /// draft states kept beside it that one of `providers` reads back; what
    /// cannot be read, fits another model or was taken under another rule
    /// is left out (with a warning naming it).
    fn load(
        &mut self,
        target: &dyn Target,
        rule: Boundaries,
        providers: &[&dyn DraftProvider],
    ) -> Vec<StoredEntry>;
    /// Keeps an entry the in-memory cache kept in `partition` (`caches`
    /// hold `tokens`) with the draft states saved with it, by provider id
    /// (each persisted where it can be: [`SavedDraft::persist`]). The same
    /// tokens in two partitions are two entries.
    fn save(
        &mut self,
        partition: &str,
        tokens: &[u32],
        caches: &CacheSet,
        drafts: &[(&str, &dyn SavedDraft)],
        rule: Boundaries,
    );
    /// Draft states added to a kept entry (its target caches unchanged).
    fn save_drafts(&mut self, partition: &str, tokens: &[u32], drafts: &[(&str, &dyn SavedDraft)]);
    /// The entry of `partition` holding `tokens` served a hit (least
    /// recently used goes first).
    fn touch(&mut self, partition: &str, tokens: &[u32]);
}

/// The draft states of `drafts` the store keeps, by provider id.
fn persisted<'a>(
    persisted: &'a [(String, String)],
    drafts: &'a SavedDrafts,
) -> Vec<(&'a str, &'a dyn SavedDraft)> {
    drafts
        .iter()
        .filter_map(|(key, d)| {
            let (_, id) = persisted.iter().find(|(k, _)| k == key)?;
            Some((id.as_str(), d.as_ref()))
        })
        .collect()
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// An empty cache with these bounds.
    pub fn new(config: PrefixCacheConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Backs the cache with `store`: its entries for `target` under `rule`
    /// are loaded now (least recently used first, so the bounds keep the
    /// most recent), and every entry kept from now on is saved to it. The
    /// draft states of `providers` (the host's own, built again under the
    /// same ids after a restart) persist with the entries; other
    /// providers' states stay in memory. Nothing happens when the cache is
    /// off.
    pub fn with_store(
        mut self,
        mut store: Box<dyn PrefixStore>,
        target: &dyn Target,
        rule: Boundaries,
        providers: &[&dyn DraftProvider],
    ) -> Self {
        if !self.config.is_on() {
            return self;
        }
        let loaded = store.load(target, rule, providers);
        let count = loaded.len();
        let mut drafts_loaded = 0;
        for entry in loaded {
            let drafts: SavedDrafts = entry
                .drafts
                .into_iter()
                .filter_map(|(id, d)| {
                    let p = providers.iter().find(|p| p.id() == id)?;
                    Some((state_key(*p), Rc::from(d)))
                })
                .collect();
            drafts_loaded += drafts.len();
            self.insert_in(entry.partition, entry.tokens, entry.caches, drafts, rule);
        }
        self.persisted = providers
            .iter()
            .map(|p| (state_key(*p), p.id().to_owned()))
            .collect();
        tracing::info!(
            loaded = count,
            drafts = drafts_loaded,
            kept = self.entries.len(),
            bytes = self.bytes(),
            "prefix cache store loaded"
        );
        self.store = Some(store);
        self
    }

    /// Drops the draft states saved under `key` (a [`state_key`]: a
    /// provider's address, which a provider built after it is gone may
    /// take); the target caches stay.
    pub fn forget_drafts_of(&mut self, key: &str) {
        for e in &mut self.entries {
            e.bytes -= e
                .drafts
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, d)| d.nbytes())
                .sum::<usize>();
            e.drafts.retain(|(k, _)| k != key);
        }
    }

    /// The bounds.
    pub fn config(&self) -> PrefixCacheConfig {
        self.config
    }

    /// The counters.
    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            bytes: self.bytes(),
            entries: self.entries.len(),
            ..self.stats
        }
    }

    /// Counts a request whose draft source started from a saved state.
    pub fn note_draft_restored(&mut self) {
        self.stats.draft_restores += 1;
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The longest usable cached prefix of `prompt` under `rule`: a copy
    /// of its caches (the entry stays as it is) holding `prompt[..b]`;
    /// `None` (a miss) when nothing is usable. With `state_of`, only
    /// entries holding a saved state of that provider count, and `b` stays
    /// within what the state covers (a source that reads tapped layers
    /// cannot prefill the rest without it).
    pub fn lookup(
        &mut self,
        prompt: &[u32],
        rule: Boundaries,
        state_of: Option<&str>,
    ) -> Option<Hit> {
        self.lookup_in("", prompt, rule, state_of)
    }

    /// [`PrefixCache::lookup`] among the entries of `partition` only.
    pub fn lookup_in(
        &mut self,
        partition: &str,
        prompt: &[u32],
        rule: Boundaries,
        state_of: Option<&str>,
    ) -> Option<Hit> {
        if !self.config.is_on() {
            return None;
        }
        let found = self
            .best_in(partition, prompt, rule, state_of)
            .and_then(|(i, b)| {
                let e = &mut self.entries[i];
                let mut caches = e.caches.duplicate()?;
                if b < e.tokens.len() {
                    caches.trim(e.tokens.len() - b).ok()?;
                }
                self.clock += 1;
                e.last_used = self.clock;
                if let Some(store) = self.store.as_mut() {
                    store.touch(&e.partition, &e.tokens);
                }
                Some(Hit {
                    caches,
                    tokens: b,
                    drafts: e.drafts.clone(),
                })
            });
        match &found {
            Some(hit) => {
                self.stats.hits += 1;
                self.stats.cached_tokens += hit.tokens as u64;
            }
            None => self.stats.misses += 1,
        }
        found
    }

    /// Prompt tokens a [`PrefixCache::lookup_in`] would start `prompt` from
    /// now (0: none), without taking the entry or counting a lookup.
    pub fn longest_in(
        &self,
        partition: &str,
        prompt: &[u32],
        rule: Boundaries,
        state_of: Option<&str>,
    ) -> usize {
        self.best_in(partition, prompt, rule, state_of)
            .map_or(0, |(_, b)| b)
    }

    /// The entry of `partition` serving the longest exact boundary of
    /// `prompt`, and that boundary.
    fn best_in(
        &self,
        partition: &str,
        prompt: &[u32],
        rule: Boundaries,
        state_of: Option<&str>,
    ) -> Option<(usize, usize)> {
        // The longest (entry, boundary).
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.partition != partition {
                continue;
            }
            let mut limit = common_prefix(&e.tokens, prompt);
            if let Some(id) = state_of {
                match e.drafts.iter().find(|(p, _)| p == id) {
                    Some((_, d)) => limit = limit.min(d.tokens()),
                    None => continue,
                }
            }
            let b = rule.within(prompt.len(), limit, e.tokens.len());
            if b == 0 || (b < e.tokens.len() && !can_trim_each(&e.caches, e.tokens.len() - b)) {
                continue;
            }
            if best.is_none_or(|(_, bb)| b > bb) {
                best = Some((i, b));
            }
        }
        best
    }

    /// Keeps `caches`, which hold exactly `tokens` (taken at an exact
    /// boundary under `rule`), with the draft states saved by the same
    /// request, evicting the least recently used entries until the bounds
    /// hold. An entry larger than the byte budget, or one whose tokens an
    /// entry already holds, is not kept. Under [`Boundaries::Any`] an entry
    /// that is a prefix of the new one, which the new one can trim to,
    /// is dropped (the new one serves it; its draft states move over), and
    /// a new one that a kept entry extends and can trim to is not kept.
    pub fn insert(
        &mut self,
        tokens: Vec<u32>,
        caches: CacheSet,
        drafts: SavedDrafts,
        rule: Boundaries,
    ) {
        self.insert_in(String::new(), tokens, caches, drafts, rule);
    }

    /// [`PrefixCache::insert`] into `partition` (entries of other
    /// partitions are neither served nor replaced by it).
    pub fn insert_in(
        &mut self,
        partition: String,
        tokens: Vec<u32>,
        caches: CacheSet,
        mut drafts: SavedDrafts,
        rule: Boundaries,
    ) {
        if !self.config.is_on() || tokens.is_empty() || caches.offset() != tokens.len() {
            return;
        }
        drafts.retain(|(_, d)| d.tokens() > 0);
        let mut bytes = caches.nbytes() + drafts.iter().map(|(_, d)| d.nbytes()).sum::<usize>();
        if bytes > self.config.max_bytes {
            tracing::debug!(
                bytes,
                budget = self.config.max_bytes,
                "prefix too large to keep"
            );
            return;
        }
        self.clock += 1;
        // A kept entry holding these tokens, or (where entries hold
        // generated tokens) one that extends them and trims to them,
        // serves them: it takes the draft states it lacks, within the
        // budget.
        let held = self.bytes();
        if let Some(e) = self.entries.iter_mut().find(|e| {
            e.partition == partition
                && (e.tokens == tokens
                    || (rule.keeps_generated()
                        && e.tokens.starts_with(&tokens)
                        && can_trim_each(&e.caches, e.tokens.len() - tokens.len())))
        }) {
            e.last_used = self.clock;
            let mut added = Vec::new();
            let mut added_bytes = 0;
            for (id, d) in drafts {
                let fits = held + added_bytes + d.nbytes() <= self.config.max_bytes;
                if fits && !e.drafts.iter().any(|(p, _)| *p == id) {
                    added_bytes += d.nbytes();
                    added.push((id, d));
                }
            }
            e.bytes += added_bytes;
            if let Some(store) = self.store.as_mut() {
                store.touch(&e.partition, &e.tokens);
                let persist = persisted(&self.persisted, &added);
                if !persist.is_empty() {
                    store.save_drafts(&e.partition, &e.tokens, &persist);
                }
            }
            e.drafts.extend(added);
            return;
        }
        if rule.keeps_generated() {
            let mut i = 0;
            while i < self.entries.len() {
                let e = &self.entries[i];
                if e.partition == partition
                    && tokens.starts_with(&e.tokens)
                    && can_trim_each(&caches, tokens.len() - e.tokens.len())
                {
                    let old = self.entries.swap_remove(i);
                    for (id, d) in old.drafts {
                        let fits = bytes + d.nbytes() <= self.config.max_bytes;
                        if fits && !drafts.iter().any(|(p, _)| *p == id) {
                            bytes += d.nbytes();
                            drafts.push((id, d));
                        }
                    }
                } else {
                    i += 1;
                }
            }
        }
        while !self.entries.is_empty()
            && (self.entries.len() >= self.config.max_entries
                || self.bytes() + bytes > self.config.max_bytes)
        {
            self.evict_oldest();
        }
        if let Some(store) = self.store.as_mut() {
            store.save(
                &partition,
                &tokens,
                &caches,
                &persisted(&self.persisted, &drafts),
                rule,
            );
        }
        self.entries.push(Entry {
            partition,
            tokens,
            caches,
            drafts,
            bytes,
            last_used: self.clock,
        });
    }

    fn evict_oldest(&mut self) {
        if let Some((i, _)) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
        {
            let e = self.entries.swap_remove(i);
            self.stats.evictions += 1;
            tracing::debug!(
                tokens = e.tokens.len(),
                bytes = e.bytes,
                "prefix cache eviction"
            );
        }
    }
}

fn can_trim_each(caches: &CacheSet, n: usize) -> bool {
    (0..caches.len()).all(|i| caches.get(i).is_some_and(|c| c.can_trim(n)))
}

#[cfg(test)]
#[path = "prefix_cache_tests.rs"]
mod tests;
