//! The draft-length controller: adapts to recent acceptance and pauses
//! drafting when it stays very low. It also keeps, per draft position, an
//! estimate of the chance a draft there is accepted once the ones before
//! it were (apart after a fully accepted round and after any other), which
//! the goodput policy reads. A position no round has reached yet is
//! estimated as the deepest one reached (a run of accepted drafts tends to
//! go on as it went: copying a span of the prompt), the prior only before
//! any round. A new request may start from what finished requests of its
//! provider measured ([`crate::priors`]) instead of the constant priors.

use crate::goodput::RowProfile;
use crate::priors::Learned;
use crate::AdaptiveConfig;

/// Weight of a new round in the per-position acceptance estimates. Slow
/// enough that a couple of unlucky rounds do not take a position below the
/// goodput policy's bar (it then goes unmeasured until a probe); see
/// docs/PERFORMANCE.md (`bench serve`, the run that changed it from 0.25).
const ESTIMATE_RATE: f64 = 0.1;
/// The estimates before any round: after a fully accepted round, and after
/// any other.
const PRIOR_HOT: f64 = 0.8;
const PRIOR_COLD: f64 = 0.5;

/// Decides each round's draft length.
#[derive(Debug, Clone)]
pub struct DraftController {
    config: AdaptiveConfig,
    max: usize,
    current: usize,
    proposed: usize,
    accepted: usize,
    paused: bool,
    /// `estimates[hot][m]`: chance the draft at position `m + 1` is
    /// accepted once the ones before it were; `hot` when the last round
    /// that drafted accepted all of its drafts.
    estimates: [Vec<f64>; 2],
    /// `reached[hot]`: how many leading positions of `estimates[hot]` a
    /// round has reached.
    reached: [usize; 2],
    hot: bool,
    /// Steps the goodput policy held this request below its cap in a row.
    starved: u32,
}

impl DraftController {
    /// A controller for drafts of at most `max` tokens.
    pub fn new(max: usize, config: AdaptiveConfig) -> Self {
        let max = max.max(1);
        let current = if config.adapt_length {
            config.start_len.clamp(1, max)
        } else {
            max
        };
        Self {
            config,
            max,
            current,
            proposed: 0,
            accepted: 0,
            paused: false,
            estimates: [vec![PRIOR_COLD; max], vec![PRIOR_HOT; max]],
            reached: [0, 0],
            hot: false,
            starved: 0,
        }
    }

    /// What this controller's rounds measured, where any reached a
    /// position.
    pub fn learned(&self) -> Option<Learned> {
        (self.reached.iter().any(|r| *r > 0)).then(|| Learned {
            accept: self.estimates.clone(),
            reached: self.reached,
        })
    }

    /// Starts the estimates from `prior` (before any round of its own):
    /// the positions it reached, the deepest of them standing for the
    /// ones past it.
    pub fn start_from(&mut self, prior: &Learned) {
        for state in 0..2 {
            let reached = prior.reached[state].min(prior.accept[state].len());
            if reached == 0 {
                continue;
            }
            let deepest = prior.accept[state][reached - 1];
            for (m, a) in self.estimates[state].iter_mut().enumerate() {
                *a = prior.accept[state]
                    .get(m)
                    .filter(|_| m < reached)
                    .copied()
                    .unwrap_or(deepest);
            }
            self.reached[state] = reached.min(self.estimates[state].len());
        }
    }

    /// Whether the goodput policy may cut this controller's lengths (it
    /// adapts them; a fixed length is honoured exactly).
    pub fn adapts(&self) -> bool {
        self.config.adapt_length
    }

    /// The request as the goodput policy sees it, drafting at most `cap`
    /// tokens this round.
    pub fn profile(&self, cap: usize) -> RowProfile {
        let state = usize::from(self.hot);
        let estimates = &self.estimates[state];
        // `RowProfile` repeats its last entry past its end: the deepest
        // position reached stands for the ones beyond it.
        let known = match self.reached[state] {
            0 => estimates.len(),
            n => n.min(estimates.len()),
        };
        RowProfile {
            cap,
            accept: estimates[..known].to_vec(),
            starved: self.starved,
        }
    }

    /// Notes the length the goodput policy gave this round: a request held
    /// below what it could draft counts towards its probe.
    pub fn note_allotted(&mut self, len: usize, cap: usize) {
        if len < cap {
            self.starved = self.starved.saturating_add(1);
        } else {
            self.starved = 0;
        }
    }

    /// The draft length for the next round (0 while paused).
    pub fn next_len(&self) -> usize {
        if self.paused {
            0
        } else {
            self.current
        }
    }

    /// Whether the pause rule has stopped drafting.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Learns a round's outcome: `drafted` proposed, `accepted` kept.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.proposed += drafted;
        self.accepted += accepted;
        let state = usize::from(self.hot);
        let estimates = &mut self.estimates[state];
        let reached = drafted.min(accepted + 1);
        for (m, a) in estimates.iter_mut().enumerate().take(reached) {
            let kept = if m < accepted { 1.0 } else { 0.0 };
            *a += ESTIMATE_RATE * (kept - *a);
        }
        self.reached[state] = self.reached[state].max(reached.min(estimates.len()));
        self.hot = accepted == drafted;
        if self.config.adapt_length {
            self.current = if accepted == drafted {
                self.current.saturating_mul(2)
            } else if accepted == 0 {
                self.current.saturating_sub(1)
            } else {
                self.config.start_len.max(accepted + 1)
            }
            .clamp(1, self.max);
        }
        if self.config.pause
            && self.proposed >= self.config.pause_after
            && (self.accepted as f64) < self.config.pause_below * self.proposed as f64
        {
            self.paused = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_follows_acceptance_within_bounds() {
        let mut c = DraftController::new(
            16,
            AdaptiveConfig {
                pause: false,
                ..AdaptiveConfig::default()
            },
        );
        assert_eq!(c.next_len(), 3, "starts at start_len");
        c.observe(3, 3);
        assert_eq!(c.next_len(), 6, "a fully accepted round doubles the length");
        c.observe(6, 6);
        c.observe(12, 12);
        assert_eq!(c.next_len(), 16, "never above num_draft");
        c.observe(16, 9);
        assert_eq!(c.next_len(), 10, "a partial acceptance of k gives k + 1");
        c.observe(10, 1);
        assert_eq!(c.next_len(), 3, "but never less than start_len");
        c.observe(3, 0);
        c.observe(2, 0);
        assert_eq!(
            c.next_len(),
            1,
            "a round that accepted nothing shortens by one"
        );
        c.observe(1, 0);
        assert_eq!(c.next_len(), 1, "never below one");
        c.observe(1, 1);
        assert_eq!(c.next_len(), 2);

        let short = DraftController::new(2, AdaptiveConfig::default());
        assert_eq!(short.next_len(), 2, "start_len is capped by num_draft");
        let mut fixed = DraftController::new(
            5,
            AdaptiveConfig {
                adapt_length: false,
                pause: false,
                ..AdaptiveConfig::default()
            },
        );
        fixed.observe(5, 0);
        assert_eq!(
            fixed.next_len(),
            5,
            "without adaptation the length is num_draft"
        );
    }

    #[test]
    fn estimates_follow_acceptance_per_position_and_after_full_rounds() {
        let mut c = DraftController::new(4, AdaptiveConfig::off());
        assert_eq!(c.profile(4).accept, vec![PRIOR_COLD; 4]);
        for _ in 0..30 {
            c.observe(4, 1); // the first draft kept, the second refused
        }
        let cold = c.profile(4).accept;
        assert!(cold[0] > 0.95 && cold[1] < 0.05, "{cold:?}");
        assert_eq!(
            cold.len(),
            2,
            "positions never reached repeat the deepest reached"
        );
        c.observe(4, 4);
        assert_eq!(
            c.profile(3).accept,
            vec![PRIOR_HOT; 4],
            "after a full round, before any round from that state"
        );
        // Hot rounds of 2 drafts, all kept: their positions near 1, and the
        // positions past them estimated as the deepest (not the prior).
        for _ in 0..30 {
            c.observe(2, 2);
        }
        let hot = c.profile(8);
        assert_eq!(hot.accept.len(), 2);
        assert!(hot.accept[1] > 0.95, "{hot:?}");
        assert_eq!(c.profile(3).cap, 3);
        c.note_allotted(0, 3);
        c.note_allotted(0, 3);
        assert_eq!(c.profile(3).starved, 2);
        c.note_allotted(1, 3);
        assert_eq!(c.profile(3).starved, 3, "cut short counts too");
        c.note_allotted(3, 3);
        assert_eq!(c.profile(3).starved, 0, "a round at its cap resets it");
        c.note_allotted(0, 0);
        assert_eq!(
            c.profile(3).starved,
            0,
            "a request that cannot draft is not starved"
        );
    }

    #[test]
    fn a_controller_starts_from_what_finished_requests_measured() {
        let mut first = DraftController::new(4, AdaptiveConfig::off());
        assert!(first.learned().is_none(), "no round, nothing learned");
        first.observe(4, 3);
        first.observe(4, 4);
        first.observe(4, 1);
        let learned = first.learned().expect("rounds reached positions");
        assert_eq!(learned.reached, [4, 2]);
        let mut next = DraftController::new(6, AdaptiveConfig::off());
        next.start_from(&learned);
        let cold = next.profile(6).accept;
        assert_eq!(cold, learned.accept[0][..4], "the positions reached");
        assert_ne!(cold, vec![PRIOR_COLD; 4]);
        // Past the end of what was learned: the deepest position reached.
        assert_eq!(next.estimates[0][5], learned.accept[0][3]);
        next.observe(6, 6);
        assert_eq!(next.profile(6).accept, learned.accept[1][..2]);
        // Nothing learned in a state keeps that state's prior.
        let mut lone = DraftController::new(3, AdaptiveConfig::off());
        lone.start_from(&crate::priors::Learned {
            accept: [vec![0.9; 3], vec![0.1; 3]],
            reached: [1, 0],
        });
        assert_eq!(lone.estimates[1], vec![PRIOR_HOT; 3]);
        assert_eq!(lone.profile(3).accept, vec![0.9]);
    }

    #[test]
    fn colibri_pause_after_24_proposals_under_10_percent() {
        let mut c = DraftController::new(
            4,
            AdaptiveConfig {
                adapt_length: false,
                ..AdaptiveConfig::default()
            },
        );
        for _ in 0..5 {
            c.observe(4, 0); // 20 proposals: too few to judge
        }
        assert!(!c.paused());
        c.observe(4, 2); // 24 proposals, 2 accepted: 8.3%
        assert!(c.paused());
        assert_eq!(c.next_len(), 0);

        let mut ok = DraftController::new(
            4,
            AdaptiveConfig {
                adapt_length: false,
                ..AdaptiveConfig::default()
            },
        );
        for _ in 0..6 {
            ok.observe(4, 1); // 25%
        }
        assert!(!ok.paused());
        let mut off = DraftController::new(4, AdaptiveConfig::off());
        for _ in 0..10 {
            off.observe(4, 0);
        }
        assert_eq!(
            off.next_len(),
            4,
            "adaptation off: fixed length, never paused"
        );
    }
}
