//! The draft-length controller: adapts to recent acceptance and pauses
//! drafting when it stays very low.

use crate::AdaptiveConfig;

/// Decides each round's draft length.
#[derive(Debug, Clone)]
pub struct DraftController {
    config: AdaptiveConfig,
    max: usize,
    current: usize,
    proposed: usize,
    accepted: usize,
    paused: bool,
}

impl DraftController {
    /// A controller for drafts of at most `max` tokens.
    pub fn new(max: usize, config: AdaptiveConfig) -> Self {
        let max = max.max(1);
        Self { config, max, current: max, proposed: 0, accepted: 0, paused: false }
    }

    /// The draft length for the next round (0 while paused).
    pub fn next_len(&self) -> usize {
        if self.paused { 0 } else { self.current }
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
        if self.config.adapt_length {
            if accepted == drafted {
                self.current = (self.current + 1).min(self.max);
            } else if accepted == 0 {
                self.current = self.current.saturating_sub(1).max(1);
            }
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
        let mut c = DraftController::new(4, AdaptiveConfig { pause: false, ..AdaptiveConfig::default() });
        assert_eq!(c.next_len(), 4);
        c.observe(4, 0);
        c.observe(3, 0);
        assert_eq!(c.next_len(), 2);
        c.observe(2, 2);
        assert_eq!(c.next_len(), 3);
        for _ in 0..5 {
            c.observe(3, 0);
        }
        assert_eq!(c.next_len(), 1, "never below one");
    }

    #[test]
    fn colibri_pause_after_24_proposals_under_10_percent() {
        let mut c = DraftController::new(4, AdaptiveConfig { adapt_length: false, ..AdaptiveConfig::default() });
        for _ in 0..5 {
            c.observe(4, 0); // 20 proposals: too few to judge
        }
        assert!(!c.paused());
        c.observe(4, 2); // 24 proposals, 2 accepted: 8.3%
        assert!(c.paused());
        assert_eq!(c.next_len(), 0);

        let mut ok = DraftController::new(4, AdaptiveConfig { adapt_length: false, ..AdaptiveConfig::default() });
        for _ in 0..6 {
            ok.observe(4, 1); // 25%
        }
        assert!(!ok.paused());
        let mut off = DraftController::new(4, AdaptiveConfig::off());
        for _ in 0..10 {
            off.observe(4, 0);
        }
        assert_eq!(off.next_len(), 4, "adaptation off: fixed length, never paused");
    }
}
