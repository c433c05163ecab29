//! The goodput policy: each step's draft lengths chosen for the whole
//! batch.
//!
//! In a step every row emits one token plus its accepted drafts, and every
//! token the step runs (a row's pending token, its drafts, prompt chunks)
//! costs time by the [`crate::step_cost`] model. The policy picks each
//! speculating row's draft length `k_i` (zero included, at most its cap)
//! to maximise expected emitted tokens per second of the step:
//!
//! ```text
//! E = sum_i (1 + sum_{j <= k_i} prod_{m <= j} a_i(m))
//! T = base + per_token * (sum_i (1 + k_i) + prefill tokens)
//! ```
//!
//! (`base` here is the step's time whatever its drafts: the model's base
//! and its per-row cost times the step's rows).
//!
//! where `a_i(m)` is row `i`'s estimated chance that its draft at position
//! `m` is accepted once the ones before it were. A draft at position `j`
//! adds `prod_{m <= j} a_i(m)` to `E` (falling with `j`) and `per_token` to
//! `T`, so taking drafts greedily by falling gain while a gain beats
//! `per_token * E / T` (the step's current goodput per token of cost)
//! reaches the best ratio.

/// Steps a speculating row may be held below its cap (zero drafts
/// included) before it gets a probe: one round at its cap. The estimates
/// of the positions the policy cuts would otherwise never learn that they
/// improved, or that they were better than estimated (no round reaches
/// them, and a request's finished estimates seed the next ones).
pub const PROBE_AFTER: u32 = 16;

/// How draft lengths are chosen when the adaptive controller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftPolicy {
    /// Each step's lengths are chosen for the batch's goodput, each within
    /// its request's own controller length.
    #[default]
    Goodput,
    /// Each request's controller alone sets its length (as if it were
    /// alone).
    PerRow,
}

impl DraftPolicy {
    /// The policy's name on the command line and in requests.
    pub fn name(self) -> &'static str {
        match self {
            DraftPolicy::Goodput => "goodput",
            DraftPolicy::PerRow => "per-row",
        }
    }

    /// Parses [`DraftPolicy::name`].
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "goodput" => Some(DraftPolicy::Goodput),
            "per-row" | "per_row" | "perrow" => Some(DraftPolicy::PerRow),
            _ => None,
        }
    }
}

/// A speculating row as the policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowProfile {
    /// The most drafts it may take this step.
    pub cap: usize,
    /// `accept[m]`: chance its draft at position `m + 1` is accepted once
    /// the ones before it were; positions past the end repeat the last.
    pub accept: Vec<f64>,
    /// Steps it was held below its cap in a row.
    pub starved: u32,
}

impl RowProfile {
    fn accept_at(&self, m: usize) -> f64 {
        self.accept
            .get(m)
            .or(self.accept.last())
            .copied()
            .unwrap_or(0.0)
            .clamp(0.0, 1.0)
    }
}

/// The draft length of each of `rows` for a step that also runs `plain`
/// rows without speculation and `prefill` prompt tokens, at `base` seconds
/// for the step whatever its drafts (its own cost and its rows') plus
/// `per_token` seconds per token.
pub fn allocate(
    rows: &[RowProfile],
    plain: usize,
    prefill: usize,
    base: f64,
    per_token: f64,
) -> Vec<usize> {
    let mut k = vec![0usize; rows.len()];
    let n = rows.len() + plain;
    // Every row emits its pending-token's successor.
    let mut emitted = n as f64;
    let mut seconds = base.max(0.0) + per_token.max(0.0) * (n + prefill) as f64;
    // Probes first: a row held below its cap long enough drafts to it.
    for (i, row) in rows.iter().enumerate() {
        if row.cap > 0 && row.starved >= PROBE_AFTER {
            k[i] = row.cap;
            let mut reach = 1.0;
            for m in 0..row.cap {
                reach *= row.accept_at(m);
                emitted += reach;
            }
            seconds += per_token.max(0.0) * row.cap as f64;
        }
    }
    // Each row's gain of its next draft position (the product so far).
    let mut reach: Vec<f64> = rows
        .iter()
        .zip(&k)
        .map(|(row, &ki)| (0..ki).map(|m| row.accept_at(m)).product())
        .collect();
    loop {
        let best = rows
            .iter()
            .enumerate()
            .filter(|(i, row)| k[*i] < row.cap)
            .map(|(i, row)| (i, reach[i] * row.accept_at(k[i])))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((i, gain)) = best else { break };
        // Worth it while it raises emitted / seconds.
        if gain <= 0.0 || gain * seconds <= per_token.max(0.0) * emitted {
            break;
        }
        k[i] += 1;
        reach[i] = gain;
        emitted += gain;
        seconds += per_token.max(0.0);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cap: usize, accept: &[f64]) -> RowProfile {
        RowProfile {
            cap,
            accept: accept.to_vec(),
            starved: 0,
        }
    }

    fn goodput(rows: &[RowProfile], k: &[usize], base: f64, per_token: f64) -> f64 {
        let mut e = 0.0;
        let mut t = base;
        for (r, &ki) in rows.iter().zip(k) {
            let mut reach = 1.0;
            e += 1.0;
            for m in 0..ki {
                reach *= r.accept_at(m);
                e += reach;
            }
            t += per_token * (1 + ki) as f64;
        }
        e / t
    }

    #[test]
    fn cheap_tokens_draft_to_the_cap() {
        let rows = vec![row(8, &[0.9]), row(4, &[0.6, 0.8]), row(6, &[0.5])];
        let k = allocate(&rows, 0, 0, 0.050, 0.00001);
        assert_eq!(k, vec![8, 4, 6]);
    }

    #[test]
    fn expensive_tokens_with_poor_acceptance_draft_nothing() {
        let rows: Vec<_> = (0..8).map(|_| row(8, &[0.2, 0.3])).collect();
        assert_eq!(allocate(&rows, 0, 0, 0.010, 0.004), vec![0; 8]);
        // Prompt chunks in the step make drafts relatively cheaper, never
        // dearer: lengths only grow with them.
        let with_prefill = allocate(&rows, 0, 512, 0.010, 0.004);
        assert!(with_prefill.iter().all(|&k| k <= 8));
    }

    #[test]
    fn good_rows_draft_and_poor_rows_do_not_in_the_same_step() {
        let mut rows: Vec<_> = (0..4).map(|_| row(8, &[0.15])).collect();
        rows.extend((0..4).map(|_| row(8, &[0.95])));
        let k = allocate(&rows, 0, 0, 0.010, 0.004);
        assert!(k[..4].iter().all(|&x| x == 0), "{k:?}");
        assert!(k[4..].iter().all(|&x| x >= 3), "{k:?}");
    }

    #[test]
    fn the_greedy_choice_is_the_best_over_every_length() {
        let rows = vec![row(3, &[0.7, 0.5, 0.9]), row(3, &[0.4, 0.95])];
        for (base, per_token) in [(0.01, 0.004), (0.02, 0.001), (0.001, 0.01)] {
            let k = allocate(&rows, 0, 0, base, per_token);
            let got = goodput(&rows, &k, base, per_token);
            for a in 0..=3 {
                for b in 0..=3 {
                    let other = goodput(&rows, &[a, b], base, per_token);
                    assert!(got >= other - 1e-12, "{k:?} {got} < [{a}, {b}] {other}");
                }
            }
        }
    }

    #[test]
    fn a_row_held_below_its_cap_gets_a_probe_at_its_cap() {
        let mut starving = row(8, &[0.05]);
        assert_eq!(allocate(&[starving.clone()], 7, 0, 0.01, 0.004), vec![0]);
        starving.starved = PROBE_AFTER;
        assert_eq!(allocate(&[starving.clone()], 7, 0, 0.01, 0.004), vec![8]);
        starving.cap = 0;
        assert_eq!(allocate(&[starving], 7, 0, 0.01, 0.004), vec![0]);
        // Cut short (its deep positions look poor), not to zero.
        let mut shallow = row(6, &[0.9, 0.1]);
        assert_eq!(allocate(&[shallow.clone()], 7, 0, 0.01, 0.004), vec![1]);
        shallow.starved = PROBE_AFTER;
        assert_eq!(allocate(&[shallow], 7, 0, 0.01, 0.004), vec![6]);
    }

    #[test]
    fn a_lone_request_keeps_its_length_when_tokens_are_cheap() {
        let lone = row(5, &[0.5]);
        assert_eq!(allocate(&[lone], 0, 0, 0.020, 0.0002), vec![5]);
        assert_eq!(allocate(&[], 3, 0, 0.020, 0.002), Vec::<usize>::new());
    }

    #[test]
    fn names_parse_back() {
        for p in [DraftPolicy::Goodput, DraftPolicy::PerRow] {
            assert_eq!(DraftPolicy::parse(p.name()), Some(p));
        }
        assert_eq!(DraftPolicy::parse("fast"), None);
    }
}
