//! Lookup rule, trimming, LRU and byte budget of the prefix cache, on a
//! host-side cache that records which tokens it holds.

use mlx_rs::Array;
use spec_core::{CacheSet, LayerCache, SpecError};

use super::*;

/// A cache whose "rows" are the token ids it was given; 100 bytes a row.
#[derive(Debug, Clone)]
struct Tokens {
    rows: Vec<u32>,
    window: Option<usize>,
}

impl LayerCache for Tokens {
    fn offset(&self) -> usize {
        self.rows.len()
    }
    fn update_and_fetch(&mut self, _: &Array, _: &Array) -> Result<(Array, Array), SpecError> {
        Err(SpecError::Invalid("not a model cache".into()))
    }
    fn can_trim(&self, n: usize) -> bool {
        n == 0 || (n <= self.rows.len() && self.window.is_none_or(|w| self.rows.len() <= w))
    }
    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: "rotated".into(),
            });
        }
        self.rows.truncate(self.rows.len() - n);
        Ok(())
    }
    fn nbytes(&self) -> usize {
        self.rows.len() * 100
    }
    fn contents(&self) -> Option<(Array, Array)> {
        None
    }
    fn duplicate(&self) -> Option<Box<dyn LayerCache>> {
        Some(Box::new(self.clone()))
    }
}

fn set(tokens: &[u32], window: Option<usize>) -> CacheSet {
    CacheSet::new(vec![Box::new(Tokens {
        rows: tokens.to_vec(),
        window,
    })])
}

fn toks(n: u32) -> Vec<u32> {
    (0..n).collect()
}

fn cache(bytes: usize, entries: usize) -> PrefixCache {
    PrefixCache::new(PrefixCacheConfig {
        max_bytes: bytes,
        max_entries: entries,
    })
}

#[test]
fn exact_boundaries_are_grid_points_and_the_prompt_body_end() {
    // Prompt of 20 tokens, chunk 8: body is 19; grid points 8 and 16.
    for (b, want) in [
        (0, false),
        (7, false),
        (8, true),
        (16, true),
        (19, true),
        (20, false),
    ] {
        assert_eq!(exact_boundary(20, 8, b), want, "b = {b}");
    }
}

#[test]
fn a_hit_takes_the_longest_exact_boundary_and_leaves_the_entry_alone() {
    let mut c = cache(1 << 20, 8);
    c.insert(toks(16), set(&toks(16), None), Vec::new());
    // A prompt extending the entry: the entry's end (16) is a grid point.
    let prompt: Vec<u32> = (0..30).collect();
    let hit = c.lookup(&prompt, 8).expect("hit");
    let (b, mut hit) = (hit.tokens, hit.caches);
    assert_eq!((b, hit.offset()), (16, 16));
    // The copy is independent: trimming it leaves the entry whole.
    hit.trim(10).expect("trim");
    let again = c.lookup(&prompt, 8).expect("hit");
    let (b, again) = (again.tokens, again.caches);
    assert_eq!((b, again.offset()), (16, 16));
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.cached_tokens, s.entries),
        (2, 0, 32, 1)
    );
}

#[test]
fn an_entry_end_off_the_grid_serves_only_the_same_prompt_body() {
    let mut c = cache(1 << 20, 8);
    // A prompt of 13 tokens prefilled to 12 (its body), chunk 8.
    c.insert(toks(12), set(&toks(12), None), Vec::new());
    // The same prompt again: 12 is its body end.
    assert_eq!(c.lookup(&toks(13), 8).map(|h| h.tokens), Some(12));
    // A longer prompt: 12 is no boundary of it; the grid point 8 inside the
    // entry is (trimmed).
    let hit = c.lookup(&toks(40), 8).expect("hit");
    let (b, hit) = (hit.tokens, hit.caches);
    assert_eq!((b, hit.offset()), (8, 8));
    // A prompt diverging at 5: no grid point inside the common part.
    let mut other = toks(40);
    other[5] = 999;
    assert!(c.lookup(&other, 8).is_none());
    assert_eq!(c.stats().misses, 1);
}

#[test]
fn a_rotated_window_is_never_trimmed_to_a_shorter_hit() {
    let mut c = cache(1 << 20, 8);
    c.insert(toks(12), set(&toks(12), Some(4)), Vec::new());
    assert!(c.lookup(&toks(40), 8).is_none());
    // Its own end still serves the same prompt body.
    assert_eq!(c.lookup(&toks(13), 8).map(|h| h.tokens), Some(12));
}

#[test]
fn the_byte_budget_and_entry_limit_hold_with_lru_eviction() {
    // 100 bytes a token: room for 40 tokens.
    let mut c = cache(4000, 3);
    c.insert(toks(16), set(&toks(16), None), Vec::new());
    let b: Vec<u32> = (100..116).collect();
    c.insert(b.clone(), set(&b, None), Vec::new());
    // Touch the first: the second is now least recently used.
    assert!(c.lookup(&toks(20), 8).is_some());
    let d: Vec<u32> = (200..209).collect();
    c.insert(d.clone(), set(&d, None), Vec::new());
    assert!(c.bytes() <= 4000, "{} bytes", c.bytes());
    assert_eq!(c.stats().evictions, 1);
    assert!(c
        .lookup(
            &[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116],
            8
        )
        .is_none());
    assert!(c.lookup(&toks(20), 8).is_some());
    // The entry limit: three small entries more leave three.
    for k in 0..3u32 {
        let t: Vec<u32> = (1000 * (k + 1)..1000 * (k + 1) + 8).collect();
        c.insert(t.clone(), set(&t, None), Vec::new());
        assert!(c.bytes() <= 4000);
        assert!(c.stats().entries <= 3);
    }
    // Larger than the whole budget: not kept, nothing evicted for it.
    let before = c.stats();
    let big = toks(41);
    c.insert(big.clone(), set(&big, None), Vec::new());
    assert_eq!(c.stats().entries, before.entries);
    assert_eq!(c.stats().evictions, before.evictions);
}

#[test]
fn an_off_cache_keeps_nothing_and_counts_nothing() {
    let mut c = PrefixCache::new(PrefixCacheConfig::off());
    c.insert(toks(16), set(&toks(16), None), Vec::new());
    assert!(c.lookup(&toks(20), 8).is_none());
    assert_eq!(c.stats(), PrefixCacheStats::default());
}

#[test]
fn caches_that_do_not_hold_the_tokens_they_claim_are_refused() {
    let mut c = cache(1 << 20, 8);
    c.insert(toks(16), set(&toks(15), None), Vec::new());
    assert_eq!(c.stats().entries, 0);
}
