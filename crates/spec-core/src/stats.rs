//! Per-request speculation statistics.

/// What a request's speculation did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    /// Tokens proposed.
    pub drafted: usize,
    /// Proposals accepted.
    pub accepted: usize,
    /// Proposals rejected.
    pub rejected: usize,
    /// Target forward passes (prefill chunks excluded).
    pub target_calls: usize,
    /// Rounds (one target forward each).
    pub rounds: usize,
    /// Accepted length of every round that drafted.
    pub acceptance_lengths: Vec<usize>,
    /// `drafted_by_pos[i]`: rounds that proposed a token at position i.
    pub drafted_by_pos: Vec<usize>,
    /// `accepted_by_pos[i]`: rounds whose position-i proposal was accepted.
    pub accepted_by_pos: Vec<usize>,
    /// Tokens emitted.
    pub emitted: usize,
    /// Whether the draft-length controller paused drafting.
    pub paused: bool,
    /// Whether speculation stopped because a cache could no longer be trimmed.
    pub untrimmable_fallback: bool,
    /// Drafts the request's constraint forced (counted in `drafted` too).
    pub forced_drafted: usize,
    /// Forced drafts accepted (counted in `accepted` too).
    pub forced_accepted: usize,
    /// A provider's drafts the constraint refused before verification (not
    /// counted in `drafted`).
    pub refused_drafts: usize,
    /// Drafts a cheap source made at the round's full length that the
    /// goodput policy then left out of the window (not counted in
    /// `drafted`; see `DraftSource::cheap_to_draft`).
    pub cut_drafts: usize,
    /// Token masks the constraint computed.
    pub masks: usize,
    /// Seconds the constraint itself took: its masks, draft checks and
    /// forced tokens (llguidance's work, for spec-grammar's constraints).
    pub grammar_seconds: f64,
    /// Seconds the host took to apply masks to the target's logits (the
    /// request's EOS ids allowed where the constraint may end, refused ids
    /// set to negative infinity).
    pub mask_apply_seconds: f64,
}

impl SpecStats {
    /// Records one verified round.
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        self.rounds += 1;
        self.target_calls += 1;
        if drafted == 0 {
            return;
        }
        self.drafted += drafted;
        self.accepted += accepted;
        self.rejected += drafted - accepted;
        self.acceptance_lengths.push(accepted);
        if self.drafted_by_pos.len() < drafted {
            self.drafted_by_pos.resize(drafted, 0);
            self.accepted_by_pos.resize(drafted, 0);
        }
        for i in 0..drafted {
            self.drafted_by_pos[i] += 1;
            if i < accepted {
                self.accepted_by_pos[i] += 1;
            }
        }
    }

    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Mean accepted length over rounds that drafted.
    pub fn mean_accepted_length(&self) -> f64 {
        if self.acceptance_lengths.is_empty() {
            0.0
        } else {
            self.acceptance_lengths.iter().sum::<usize>() as f64
                / self.acceptance_lengths.len() as f64
        }
    }

    /// Tokens emitted per target forward.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.target_calls == 0 {
            0.0
        } else {
            self.emitted as f64 / self.target_calls as f64
        }
    }

    /// Target forwards saved against plain decoding.
    pub fn forwards_saved(&self) -> usize {
        self.emitted.saturating_sub(self.target_calls)
    }

    /// Adds `other`'s counts to these (several requests' speculation as
    /// one: counts summed, per-position counts summed position by
    /// position, acceptance lengths of both, flags of either).
    pub fn absorb(&mut self, other: &SpecStats) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.rejected += other.rejected;
        self.target_calls += other.target_calls;
        self.rounds += other.rounds;
        self.acceptance_lengths
            .extend_from_slice(&other.acceptance_lengths);
        add_by_position(&mut self.drafted_by_pos, &other.drafted_by_pos);
        add_by_position(&mut self.accepted_by_pos, &other.accepted_by_pos);
        self.emitted += other.emitted;
        self.paused |= other.paused;
        self.untrimmable_fallback |= other.untrimmable_fallback;
        self.forced_drafted += other.forced_drafted;
        self.forced_accepted += other.forced_accepted;
        self.refused_drafts += other.refused_drafts;
        self.cut_drafts += other.cut_drafts;
        self.masks += other.masks;
        self.grammar_seconds += other.grammar_seconds;
        self.mask_apply_seconds += other.mask_apply_seconds;
    }
}

fn add_by_position(into: &mut Vec<usize>, from: &[usize]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absorbing_gives_the_counts_of_both_requests_rounds() {
        let mut a = SpecStats::default();
        a.record_round(3, 2);
        a.emitted = 3;
        let mut b = SpecStats::default();
        b.record_round(5, 5);
        b.record_round(0, 0);
        b.emitted = 7;
        b.paused = true;
        let mut both = SpecStats::default();
        both.record_round(3, 2);
        both.record_round(5, 5);
        both.record_round(0, 0);
        both.emitted = 10;
        both.paused = true;
        a.absorb(&b);
        assert_eq!(a, both);
        assert_eq!(a.acceptance_rate(), 7.0 / 8.0);
        assert_eq!(a.tokens_per_forward(), 10.0 / 3.0);
    }
}
