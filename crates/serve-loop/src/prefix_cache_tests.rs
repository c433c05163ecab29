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
        Err(spec_core::InputError::ForeignCache("not a model cache".into()).into())
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

const GRID: Boundaries = Boundaries::Grid(8);

fn toks(n: u32) -> Vec<u32> {
    (0..n).collect()
}

fn cache(bytes: usize, entries: usize) -> PrefixCache {
    PrefixCache::new(PrefixCacheConfig {
        max_bytes: bytes,
        max_entries: entries,
        share_tenants: false,
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
        assert_eq!(GRID.exact(20, b), want, "b = {b}");
    }
}

#[test]
fn a_hit_takes_the_longest_exact_boundary_and_leaves_the_entry_alone() {
    let mut c = cache(1 << 20, 8);
    c.insert(toks(16), set(&toks(16), None), Vec::new(), GRID);
    // A prompt extending the entry: the entry's end (16) is a grid point.
    let prompt: Vec<u32> = (0..30).collect();
    let hit = c.lookup(&prompt, GRID, None).expect("hit");
    let (b, mut hit) = (hit.tokens, hit.caches);
    assert_eq!((b, hit.offset()), (16, 16));
    // The copy is independent: trimming it leaves the entry whole.
    hit.trim(10).expect("trim");
    let again = c.lookup(&prompt, GRID, None).expect("hit");
    let (b, again) = (again.tokens, again.caches);
    assert_eq!((b, again.offset()), (16, 16));
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.cached_tokens, s.entries),
        (2, 0, 32, 1)
    );
}

#[test]
fn longest_in_sees_what_a_lookup_would_take_without_taking_or_counting_it() {
    let mut c = cache(1 << 20, 8);
    c.insert_in(
        "t1:a;".into(),
        toks(16),
        set(&toks(16), None),
        Vec::new(),
        GRID,
    );
    let prompt = toks(30);
    assert_eq!(c.longest_in("t1:a;", &prompt, GRID, None), 16);
    assert_eq!(
        c.longest_in("", &prompt, GRID, None),
        0,
        "another partition"
    );
    // Within the entry, on the grid only; anywhere under `Any`.
    assert_eq!(c.longest_in("t1:a;", &toks(13), GRID, None), 8);
    assert_eq!(c.longest_in("t1:a;", &toks(13), Boundaries::Any, None), 12);
    // A source's state is needed where one is named.
    assert_eq!(c.longest_in("t1:a;", &prompt, GRID, Some("p@0x1")), 0);
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (0, 0), "peeking counts nothing");
    let hit = c.lookup_in("t1:a;", &prompt, GRID, None).expect("hit");
    assert_eq!(hit.tokens, 16);
}

#[test]
fn an_entry_end_off_the_grid_serves_only_the_same_prompt_body() {
    let mut c = cache(1 << 20, 8);
    // A prompt of 13 tokens prefilled to 12 (its body), chunk 8.
    c.insert(toks(12), set(&toks(12), None), Vec::new(), GRID);
    // The same prompt again: 12 is its body end.
    assert_eq!(c.lookup(&toks(13), GRID, None).map(|h| h.tokens), Some(12));
    // A longer prompt: 12 is no boundary of it; the grid point 8 inside the
    // entry is (trimmed).
    let hit = c.lookup(&toks(40), GRID, None).expect("hit");
    let (b, hit) = (hit.tokens, hit.caches);
    assert_eq!((b, hit.offset()), (8, 8));
    // A prompt diverging at 5: no grid point inside the common part.
    let mut other = toks(40);
    other[5] = 999;
    assert!(c.lookup(&other, GRID, None).is_none());
    assert_eq!(c.stats().misses, 1);
}

#[test]
fn a_rotated_window_is_never_trimmed_to_a_shorter_hit() {
    let mut c = cache(1 << 20, 8);
    c.insert(toks(12), set(&toks(12), Some(4)), Vec::new(), GRID);
    assert!(c.lookup(&toks(40), GRID, None).is_none());
    // Its own end still serves the same prompt body.
    assert_eq!(c.lookup(&toks(13), GRID, None).map(|h| h.tokens), Some(12));
}

#[test]
fn the_byte_budget_and_entry_limit_hold_with_lru_eviction() {
    // 100 bytes a token: room for 40 tokens.
    let mut c = cache(4000, 3);
    c.insert(toks(16), set(&toks(16), None), Vec::new(), GRID);
    let b: Vec<u32> = (100..116).collect();
    c.insert(b.clone(), set(&b, None), Vec::new(), GRID);
    // Touch the first: the second is now least recently used.
    assert!(c.lookup(&toks(20), GRID, None).is_some());
    let d: Vec<u32> = (200..209).collect();
    c.insert(d.clone(), set(&d, None), Vec::new(), GRID);
    assert!(c.bytes() <= 4000, "{} bytes", c.bytes());
    assert_eq!(c.stats().evictions, 1);
    assert!(c
        .lookup(
            &[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116],
            GRID,
            None
        )
        .is_none());
    assert!(c.lookup(&toks(20), GRID, None).is_some());
    // The entry limit: three small entries more leave three.
    for k in 0..3u32 {
        let t: Vec<u32> = (1000 * (k + 1)..1000 * (k + 1) + 8).collect();
        c.insert(t.clone(), set(&t, None), Vec::new(), GRID);
        assert!(c.bytes() <= 4000);
        assert!(c.stats().entries <= 3);
    }
    // Larger than the whole budget: not kept, nothing evicted for it.
    let before = c.stats();
    let big = toks(41);
    c.insert(big.clone(), set(&big, None), Vec::new(), GRID);
    assert_eq!(c.stats().entries, before.entries);
    assert_eq!(c.stats().evictions, before.evictions);
}

#[test]
fn an_off_cache_keeps_nothing_and_counts_nothing() {
    let mut c = PrefixCache::new(PrefixCacheConfig::off());
    c.insert(toks(16), set(&toks(16), None), Vec::new(), GRID);
    assert!(c.lookup(&toks(20), GRID, None).is_none());
    assert_eq!(c.stats(), PrefixCacheStats::default());
}

#[test]
fn caches_that_do_not_hold_the_tokens_they_claim_are_refused() {
    let mut c = cache(1 << 20, 8);
    c.insert(toks(16), set(&toks(15), None), Vec::new(), GRID);
    assert_eq!(c.stats().entries, 0);
}

#[test]
fn a_split_invariant_target_hits_at_any_boundary_up_to_the_prompt_body() {
    let any = Boundaries::Any;
    for (b, want) in [(0, false), (1, true), (13, true), (19, true), (20, false)] {
        assert_eq!(any.exact(20, b), want, "b = {b}");
    }
    let mut c = cache(1 << 20, 8);
    c.insert(toks(13), set(&toks(13), None), Vec::new(), any);
    // A prompt extending the entry: its end, off the grid.
    assert_eq!(c.lookup(&toks(30), any, None).map(|h| h.tokens), Some(13));
    // A prompt diverging at 5: trimmed to 5.
    let mut other = toks(30);
    other[5] = 999;
    let hit = c.lookup(&other, any, None).expect("hit");
    assert_eq!((hit.tokens, hit.caches.offset()), (5, 5));
    // The same tokens as a prompt: its body end, 12.
    assert_eq!(c.lookup(&toks(13), any, None).map(|h| h.tokens), Some(12));
    // Under the grid rule the same entry serves only its own end or 8.
    assert_eq!(c.lookup(&other, GRID, None).map(|h| h.tokens), None);
    assert_eq!(c.lookup(&toks(30), GRID, None).map(|h| h.tokens), Some(8));
    // A rotated window is never trimmed, on any boundary.
    let mut w = cache(1 << 20, 8);
    w.insert(toks(13), set(&toks(13), Some(4)), Vec::new(), any);
    assert!(w.lookup(&other, any, None).is_none());
    assert_eq!(w.lookup(&toks(30), any, None).map(|h| h.tokens), Some(13));
}

#[test]
fn a_longer_entry_replaces_the_prefixes_it_can_trim_to() {
    let any = Boundaries::Any;
    let mut c = cache(1 << 20, 8);
    c.insert(toks(10), set(&toks(10), None), Vec::new(), any);
    c.insert(toks(25), set(&toks(25), None), Vec::new(), any);
    assert_eq!(c.stats().entries, 1);
    assert_eq!(c.lookup(&toks(11), any, None).map(|h| h.tokens), Some(10));
    // A shorter one the kept entry serves is not kept.
    c.insert(toks(15), set(&toks(15), None), Vec::new(), any);
    assert_eq!(c.stats().entries, 1);
    // One it cannot trim to stays; under the grid rule nothing is replaced.
    let mut w = cache(1 << 20, 8);
    w.insert(toks(10), set(&toks(10), None), Vec::new(), any);
    w.insert(toks(25), set(&toks(25), Some(4)), Vec::new(), any);
    assert_eq!(w.stats().entries, 2);
    let mut g = cache(1 << 20, 8);
    g.insert(toks(10), set(&toks(10), None), Vec::new(), GRID);
    g.insert(toks(25), set(&toks(25), None), Vec::new(), GRID);
    assert_eq!(g.stats().entries, 2);
}

/// A saved draft state covering the first `tokens` tokens.
#[derive(Debug)]
struct State(usize);

impl SavedDraft for State {
    fn tokens(&self) -> usize {
        self.0
    }
    fn nbytes(&self) -> usize {
        10
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn a_lookup_for_a_provider_state_stays_within_what_the_state_covers() {
    let any = Boundaries::Any;
    let mut c = cache(1 << 20, 8);
    let drafts: SavedDrafts = vec![("p@1".into(), Rc::new(State(9)))];
    c.insert(toks(20), set(&toks(20), None), drafts, any);
    c.insert((100..120).collect(), set(&toks(20), None), Vec::new(), any);
    let hit = c.lookup(&toks(30), any, Some("p@1")).expect("hit");
    assert_eq!((hit.tokens, hit.drafts.len()), (9, 1));
    assert_eq!(
        c.lookup(&toks(30), GRID, Some("p@1")).map(|h| h.tokens),
        Some(8)
    );
    // Without a state of that provider: no hit for it, a full one for others.
    assert!(c.lookup(&toks(30), any, Some("q@2")).is_none());
    assert_eq!(c.lookup(&toks(30), any, None).map(|h| h.tokens), Some(20));
}

#[test]
fn partitions_keep_apart_tenants_and_salts() {
    let any = Boundaries::Any;
    let alice = cache_partition(Some("key-1"), None, false);
    let bob = cache_partition(Some("key-2"), None, false);
    let salted = cache_partition(Some("key-1"), Some("s"), false);
    let mut c = cache(1 << 20, 8);
    c.insert_in(
        alice.clone(),
        toks(20),
        set(&toks(20), None),
        Vec::new(),
        any,
    );
    assert_eq!(
        c.lookup_in(&alice, &toks(30), any, None).map(|h| h.tokens),
        Some(20)
    );
    for other in [&bob, &salted, &String::new()] {
        assert!(
            c.lookup_in(other, &toks(30), any, None).is_none(),
            "partition {other:?} must not see key-1's entry"
        );
    }
    // Bob's own copy of the same tokens is a second entry; neither replaces
    // the other, nor does a prefix of it trim Alice's.
    c.insert_in(bob.clone(), toks(20), set(&toks(20), None), Vec::new(), any);
    c.insert_in(bob.clone(), toks(10), set(&toks(10), None), Vec::new(), any);
    c.insert_in(
        alice.clone(),
        toks(25),
        set(&toks(25), None),
        Vec::new(),
        any,
    );
    assert_eq!(c.stats().entries, 2, "alice 25 (replacing her 20), bob 20");
    assert_eq!(
        c.lookup_in(&bob, &toks(30), any, None).map(|h| h.tokens),
        Some(20)
    );
    assert_eq!(
        c.lookup_in(&alice, &toks(30), any, None).map(|h| h.tokens),
        Some(25)
    );
}

#[test]
fn partition_names_are_unambiguous_and_sharing_drops_the_tenant() {
    assert_eq!(cache_partition(None, None, false), "");
    assert_eq!(cache_partition(Some("key-1"), None, true), "");
    assert_eq!(
        cache_partition(Some("key-1"), Some("x"), true),
        cache_partition(Some("key-2"), Some("x"), true)
    );
    // A salt cannot impersonate a tenant, nor a split move between parts.
    assert_ne!(
        cache_partition(Some("key-1"), None, false),
        cache_partition(None, Some("key-1"), false)
    );
    assert_ne!(
        cache_partition(Some("a"), Some("b;s1:c"), false),
        cache_partition(Some("a;s1:b"), Some("c"), false)
    );
}
