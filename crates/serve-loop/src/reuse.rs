//! A request's prefix-cache bookkeeping: the partition it reads and fills,
//! the snapshots its prefill takes at the exact boundaries a later prompt
//! can reuse, its provider's saved state (restored from a hit, saved after
//! its own prefill), the entries it publishes while it runs (for requests
//! waiting on a prefix it shares, see [`crate::shared_prefill`]) and the
//! entries it leaves when it ends.

use std::rc::Rc;

use spec_core::{CacheSet, SavedDraft};

use crate::prefix_cache::{Boundaries, SavedDrafts};

/// A prefix-cache entry: the tokens the caches hold, the caches, and the
/// draft states saved with them.
pub(crate) type Entry = (Vec<u32>, CacheSet, SavedDrafts);

/// What a request keeps for the prefix cache.
pub(crate) struct Reuse {
    /// Where the prefix cache may reuse this target's caches.
    pub(crate) rule: Boundaries,
    /// Whether snapshots (and the source's saved state) are kept.
    keep: bool,
    /// Offsets at which prefill snapshots its caches.
    snapshot_at: Vec<usize>,
    /// Snapshots taken: the tokens held and a copy of the caches.
    snapshots: Vec<(usize, CacheSet)>,
    /// Points other requests wait for (split-invariant targets): once the
    /// caches hold that many committed tokens (and, where the point is
    /// marked, the prefill has ended and the source's state is saved), a
    /// copy trimmed there is published.
    shares: Vec<(usize, bool)>,
    /// The prefix cache's partition this request reads and fills.
    pub(crate) partition: String,
    /// The key of this request's provider's saved states in the prefix
    /// cache: its id and its address (a provider built for other options
    /// has the same id; the engine forgets a provider's states before its
    /// address can be reused).
    pub(crate) state_key: Option<String>,
    /// A saved state of this request's provider from the prefix cache hit,
    /// and the tokens it may keep.
    pub(crate) restore: Option<(Rc<dyn SavedDraft>, usize)>,
    /// The source's state right after its prefill, for the prefix cache.
    saved_draft: Option<Rc<dyn SavedDraft>>,
    /// Whether the source started from a saved state (`prefill_from`).
    pub(crate) draft_restored: bool,
}

/// Where a request starting at `start` snapshots its caches: the last grid
/// point (the grid of `chunk` from `origin`) of `prompt[..len-1]` and its
/// end (the exact boundaries a later prompt can reuse, see
/// [`crate::prefix_cache`]), past `start`.
fn snapshot_points(prompt_len: usize, chunk: usize, start: usize, origin: usize) -> Vec<usize> {
    let body = prompt_len.saturating_sub(1);
    let grid = origin + body.saturating_sub(origin) / chunk.max(1) * chunk;
    let mut at: Vec<usize> = [grid, body].into_iter().filter(|&b| b > start).collect();
    at.dedup();
    at
}

/// Whether every cache of `caches` can be trimmed to hold `n` tokens.
fn can_trim_to(caches: &CacheSet, n: usize) -> bool {
    let extra = caches.offset().saturating_sub(n);
    (0..caches.len()).all(|i| caches.get(i).is_some_and(|c| c.can_trim(extra)))
}

/// The prompt's shape as the snapshots see it.
pub(crate) struct Grid {
    /// Prompt tokens.
    pub(crate) prompt_len: usize,
    /// The prefill chunk.
    pub(crate) chunk: usize,
    /// Tokens the caches hold at the start.
    pub(crate) start: usize,
    /// Where the prefill grid starts.
    pub(crate) origin: usize,
}

impl Reuse {
    /// Bookkeeping under `rule` in `partition`; `keep` when the request
    /// fills a prefix cache.
    pub(crate) fn new(
        rule: Boundaries,
        keep: bool,
        grid: &Grid,
        partition: String,
        state_key: Option<String>,
    ) -> Self {
        let mut reuse = Self {
            rule,
            keep,
            snapshot_at: Vec::new(),
            snapshots: Vec::new(),
            shares: Vec::new(),
            partition,
            state_key,
            restore: None,
            saved_draft: None,
            draft_restored: false,
        };
        reuse.start_at(grid);
        reuse
    }

    /// The prefill starts (again) as `grid` says: the snapshot points are
    /// planned from there; snapshots taken before are dropped.
    pub(crate) fn start_at(&mut self, grid: &Grid) {
        self.snapshots.clear();
        self.snapshot_at = if self.keep {
            snapshot_points(grid.prompt_len, grid.chunk, grid.start, grid.origin)
        } else {
            Vec::new()
        };
    }

    /// Whether a snapshot at `at` is taken (or planned).
    pub(crate) fn snapshots_at(&self, at: usize) -> bool {
        self.snapshot_at.contains(&at) || self.snapshots.iter().any(|(n, _)| *n == at)
    }

    /// A request waits for a prefix of `at` tokens: on a split-invariant
    /// target a copy trimmed there is published once the caches hold it
    /// (`with_state`: once the prefill has ended, with the source's saved
    /// state); otherwise the prefill also snapshots there (an exact
    /// boundary; snapshots are published when the prefill ends).
    pub(crate) fn share_at(&mut self, at: usize, with_state: bool) {
        if !self.keep {
            return;
        }
        if !self.rule.keeps_generated() {
            if !self.snapshot_at.contains(&at) {
                self.snapshot_at.push(at);
            }
        } else if !self.shares.contains(&(at, with_state)) {
            self.shares.push((at, with_state));
        }
    }

    /// The draft states kept with this request's entries.
    fn drafts(&self) -> SavedDrafts {
        match (&self.state_key, &self.saved_draft) {
            (Some(key), Some(saved)) => vec![(key.clone(), Rc::clone(saved))],
            _ => Vec::new(),
        }
    }

    /// The entries to publish now: for each share point the caches reached
    /// (`held` committed tokens of `history`), a copy trimmed there (a
    /// cache that cannot trim so far drops the point); once `prefilled`
    /// (the source's saved state is known), the prefill's snapshots.
    pub(crate) fn take_published(
        &mut self,
        caches: &CacheSet,
        history: &[u32],
        held: usize,
        prefilled: bool,
    ) -> Vec<Entry> {
        if !self.keep {
            return Vec::new();
        }
        let mut out = Vec::new();
        let (reached, later): (Vec<_>, Vec<_>) = self
            .shares
            .iter()
            .partition(|&&(at, with_state)| at <= held && (prefilled || !with_state));
        self.shares = later;
        for (at, _) in reached {
            if at == 0 || !can_trim_to(caches, at) {
                continue;
            }
            let Some(mut copy) = caches.duplicate() else {
                continue;
            };
            let extra = copy.offset() - at;
            if extra == 0 || copy.trim(extra).is_ok() {
                out.push((history[..at].to_vec(), copy, self.drafts()));
            }
        }
        if prefilled {
            let drafts = self.drafts();
            out.extend(
                std::mem::take(&mut self.snapshots)
                    .into_iter()
                    .map(|(n, caches)| (history[..n].to_vec(), caches, drafts.clone())),
            );
        }
        out
    }

    /// Whether the request fills the prefix cache (it keeps snapshots and
    /// its source's state right after its prefill, `save_prefill`).
    pub(crate) fn keeps(&self) -> bool {
        self.keep
    }

    /// Keeps `saved`, the source's state right after its prefill.
    pub(crate) fn set_saved_draft(&mut self, saved: Option<Rc<dyn SavedDraft>>) {
        self.saved_draft = saved;
    }

    /// The request starts over from the prompt's start (a source declined
    /// its saved state): snapshots restart on the grid from 0.
    pub(crate) fn restart_cold(&mut self, prompt_len: usize, chunk: usize) {
        self.start_at(&Grid {
            prompt_len,
            chunk,
            start: 0,
            origin: 0,
        });
    }

    /// After a prefill chunk brought the caches to `held` tokens: keeps a
    /// copy of them when `held` is a snapshot point, unless the request's
    /// final entry will serve that prefix anyway (`max_tokens` bounds what
    /// the request appends).
    pub(crate) fn after_chunk(&mut self, held: usize, caches: &CacheSet, max_tokens: usize) {
        if self.snapshot_at.contains(&held) && !self.final_entry_covers(caches, max_tokens) {
            if let Some(copy) = caches.duplicate() {
                self.snapshots.push((held, copy));
            }
        }
    }

    /// Whether the entry this request leaves when it ends (its prompt and
    /// generated tokens, [`Reuse::take_entries`]) will serve every prefix a
    /// snapshot taken now would: entries keep generated tokens and every
    /// cache can still trim back here after whatever the request appends
    /// (unbounded caches only: a sliding window may rotate). A snapshot
    /// would then be dropped at the end, and until then its shared buffers
    /// make the next step copy every cache (on the way to the first token).
    fn final_entry_covers(&self, caches: &CacheSet, max_tokens: usize) -> bool {
        // The most a request appends past its prompt: its tokens, the last
        // one's row, and drafts left unemitted (far fewer than 4096).
        let most = max_tokens.saturating_add(4097);
        let unbounded =
            (0..caches.len()).all(|i| caches.get(i).is_some_and(|c| c.window().is_none()));
        self.rule.keeps_generated() && unbounded && caches.can_trim_after(most, most)
    }

    /// What the request leaves to the prefix cache, with the tokens each
    /// holds, and the rule they were taken under: its prefill snapshots
    /// and, where entries may hold generated tokens, its caches (taken from
    /// `caches`) trimmed to the tokens of `history` it committed (then only
    /// the snapshots those cannot be trimmed to). Nothing once the request
    /// `failed` (its caches are suspect). The entries belong to its
    /// partition.
    pub(crate) fn take_entries(
        &mut self,
        failed: bool,
        caches: &mut CacheSet,
        prompt: &[u32],
        history: &[u32],
    ) -> (Vec<Entry>, Boundaries) {
        let mut snapshots = std::mem::take(&mut self.snapshots);
        if failed || !self.keep {
            return (Vec::new(), self.rule);
        }
        let drafts = self.drafts();
        let mut entries = Vec::new();
        if self.rule.keeps_generated() {
            // Rows past the history (accepted drafts left unemitted at max
            // tokens, a pipelined step queued past the end) are dropped.
            let held = caches.offset().min(history.len());
            let mut caches = std::mem::replace(caches, CacheSet::new(Vec::new()));
            let extra = caches.offset() - held;
            if held > 0 && (extra == 0 || caches.trim(extra).is_ok()) {
                snapshots.retain(|(n, _)| !can_trim_to(&caches, *n));
                entries.push((history[..held].to_vec(), caches, drafts.clone()));
            }
        }
        entries.extend(
            snapshots
                .into_iter()
                .map(|(n, caches)| (prompt[..n].to_vec(), caches, drafts.clone())),
        );
        (entries, self.rule)
    }
}
