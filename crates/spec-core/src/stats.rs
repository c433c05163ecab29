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
}
