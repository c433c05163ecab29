//! Per-request speculation settings.

use crate::goodput::DraftPolicy;

/// How drafts are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// Accept a draft while it equals the token the request's sampler draws
    /// at that position (mlx-lm's convention; exact for greedy decoding).
    #[default]
    ExactMatch,
    /// Leviathan et al.'s rejection sampling: accept with probability
    /// `min(1, p/q)`, resample from `norm(max(p - q, 0))` on rejection.
    /// Lossless for any sampler; used when temperature > 0.
    Rejection,
}

/// Draft-length adaptation and the low-acceptance pause.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// Adapt the draft length (between 1 and `num_draft`) to the last
    /// round: double it after a round that accepted every draft, set it to
    /// `max(start_len, accepted + 1)` after a partial acceptance, and
    /// shorten it by one after a round that accepted nothing. Doubling
    /// lets a drafter that is copying (prompt lookup inside a quoted span)
    /// reach long drafts in a few rounds, while a miss costs one short
    /// round, not a long one.
    pub adapt_length: bool,
    /// The first round's draft length (capped by `num_draft`) and the
    /// length a partial acceptance falls back to.
    pub start_len: usize,
    /// Stop drafting for the rest of the request when acceptance stays
    /// below `pause_below` after `pause_after` proposals (Colibri's rule:
    /// 10% after 24).
    pub pause: bool,
    /// Acceptance rate under which drafting pauses.
    pub pause_below: f64,
    /// Proposals before the pause rule is judged.
    pub pause_after: usize,
    /// In a batch, whether each step's lengths are chosen for the whole
    /// batch's goodput (within each request's controller length, which
    /// stays its cap) or left to each request's controller. Only applies
    /// while `adapt_length` is on: a fixed length is honoured exactly.
    pub policy: DraftPolicy,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            adapt_length: true,
            start_len: 3,
            pause: true,
            pause_below: 0.10,
            pause_after: 24,
            policy: DraftPolicy::Goodput,
        }
    }
}

impl AdaptiveConfig {
    /// Fixed draft length, never paused and never cut by the goodput
    /// policy (mlx-lm's behaviour): every round drafts `num_draft` tokens
    /// wherever max tokens and the caches' rollback allow.
    pub fn off() -> Self {
        Self {
            adapt_length: false,
            pause: false,
            policy: DraftPolicy::PerRow,
            ..Self::default()
        }
    }

    /// The default settings with `policy`.
    pub fn with_policy(policy: DraftPolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }
}

/// Speculation settings of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    /// Draft tokens per round (gamma); at least 1.
    pub num_draft: usize,
    /// Verification rule.
    pub verify: VerifyMode,
    /// Adaptation.
    pub adaptive: AdaptiveConfig,
    /// Seed of the acceptance draws of rejection sampling.
    pub seed: u64,
}

impl Default for SpecConfig {
    fn default() -> Self {
        Self {
            num_draft: 3,
            verify: VerifyMode::ExactMatch,
            adaptive: AdaptiveConfig::default(),
            seed: 0,
        }
    }
}
