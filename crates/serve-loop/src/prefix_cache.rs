//! The in-memory prefix cache: target caches kept at exact prompt
//! boundaries, keyed by the tokens they hold, reused by later requests that
//! start with the same tokens; bounded in bytes and entries, least recently
//! used first out.
//!
//! Exactness by construction: prefill runs `prompt[..len-1]` on a fixed grid
//! of `chunk` tokens from the prompt's start, so the caches after the first
//! `b` tokens are the bits a cold prefill of ANY prompt starting with those
//! tokens holds at `b` when `b` is a grid point (`b % chunk == 0`, `b <=
//! len-1`), or when `b` is that prompt's own `len-1`. Entries are snapshots
//! taken at such points during prefill (never after generation, whose
//! verify windows split the tokens differently), and a hit is taken only at
//! such a point of the new prompt: the entry's own end, or a grid point
//! inside a longer entry trimmed to it where every cache trims exactly (a
//! rotated sliding window does not). So no architecture needs to be
//! split-invariant (GLM's prefill is not).

use std::rc::Rc;

use spec_core::{CacheSet, SavedDraft};

/// Draft sources' saved states, by provider id, kept with an entry.
pub type SavedDrafts = Vec<(String, Rc<dyn SavedDraft>)>;

/// A usable cached prefix, as [`PrefixCache::lookup`] finds it.
#[derive(Debug)]
pub struct Hit {
    /// A copy of the target caches, holding `prompt[..tokens]`.
    pub caches: CacheSet,
    /// Prompt tokens they hold.
    pub tokens: usize,
    /// Draft sources' states saved by the request that made the entry
    /// (each covers at least `tokens` of the same tokens).
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
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            max_entries: DEFAULT_PREFIX_CACHE_ENTRIES,
        }
    }
}

impl PrefixCacheConfig {
    /// A cache that keeps nothing.
    pub fn off() -> Self {
        Self {
            max_bytes: 0,
            max_entries: 0,
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
}

#[derive(Debug)]
struct Entry {
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
}

/// Whether the caches after `prompt[..b]` are what a cold prefill of
/// `prompt` holds at `b` (see the module docs).
pub fn exact_boundary(prompt_len: usize, chunk: usize, b: usize) -> bool {
    let body = prompt_len.saturating_sub(1);
    b > 0 && b <= body && (b == body || (chunk > 0 && b.is_multiple_of(chunk)))
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
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

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The longest usable cached prefix of `prompt` under a prefill grid of
    /// `chunk`: a copy of its caches (the entry stays as it is) holding
    /// `prompt[..b]`; `None` (a miss) when nothing is usable.
    pub fn lookup(&mut self, prompt: &[u32], chunk: usize) -> Option<Hit> {
        if !self.config.is_on() {
            return None;
        }
        // Candidates, longest first: (entry, boundary).
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let common = common_prefix(&e.tokens, prompt);
            let b = if common == e.tokens.len() && exact_boundary(prompt.len(), chunk, common) {
                common
            } else {
                // A grid point inside the entry, trimmed to it.
                let grid = common.min(prompt.len().saturating_sub(1)) / chunk.max(1) * chunk;
                let grid = grid.min(e.tokens.len());
                if grid == 0
                    || !exact_boundary(prompt.len(), chunk, grid)
                    || !can_trim_each(&e.caches, e.tokens.len() - grid)
                {
                    continue;
                }
                grid
            };
            if best.is_none_or(|(_, bb)| b > bb) {
                best = Some((i, b));
            }
        }
        let found = best.and_then(|(i, b)| {
            let e = &mut self.entries[i];
            let mut caches = e.caches.duplicate()?;
            if b < e.tokens.len() {
                caches.trim(e.tokens.len() - b).ok()?;
            }
            self.clock += 1;
            e.last_used = self.clock;
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

    /// Keeps `caches`, which hold exactly `tokens` (taken at an exact
    /// boundary), with the draft states saved by the same request, evicting the least recently used entries until the
    /// bounds hold. An entry larger than the byte budget, or one whose
    /// tokens an entry already holds, is not kept.
    pub fn insert(&mut self, tokens: Vec<u32>, caches: CacheSet, drafts: SavedDrafts) {
        if !self.config.is_on() || tokens.is_empty() || caches.offset() != tokens.len() {
            return;
        }
        let drafts: SavedDrafts = drafts
            .into_iter()
            .filter(|(_, d)| d.tokens() >= tokens.len())
            .collect();
        let bytes = caches.nbytes() + drafts.iter().map(|(_, d)| d.nbytes()).sum::<usize>();
        if bytes > self.config.max_bytes {
            tracing::debug!(
                bytes,
                budget = self.config.max_bytes,
                "prefix too large to keep"
            );
            return;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens == tokens) {
            e.last_used = self.clock;
            return;
        }
        while !self.entries.is_empty()
            && (self.entries.len() >= self.config.max_entries
                || self.bytes() + bytes > self.config.max_bytes)
        {
            self.evict_oldest();
        }
        self.entries.push(Entry {
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
