//! The step cost model: what one shared step costs as a function of the
//! tokens it runs, learned online from the scheduler's own steps.
//!
//! Each step's wall time is fitted as `base + per_token * tokens` by
//! exponentially weighted least squares (old steps fade, so the model
//! follows the machine as it warms up or gets busier). A timing far from
//! the model (a stalled step, a clock jump) is rejected; a long run of
//! rejections means the machine really changed, and the model starts over.
//! Timings never change what a request emits, only how long it drafts.

/// Weight each older step keeps per new step (about 64 steps of memory).
const DECAY: f64 = 0.985;
/// Steps the model needs before it is trusted.
const MIN_STEPS: u32 = 8;
/// Timings above this are nonsense (a suspended process): clamped.
const MAX_SECONDS: f64 = 30.0;
/// A timing more than `OUTLIER_FACTOR` times the prediction away from it
/// (either way; plus [`OUTLIER_SLACK`]) is an outlier.
const OUTLIER_FACTOR: f64 = 4.0;
/// Absolute slack of the outlier test, for very short steps.
const OUTLIER_SLACK: f64 = 0.002;
/// Consecutive outliers after which the model restarts from them.
const RESTART_AFTER: u32 = 12;

/// What the model knows, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCostStats {
    /// Fitted seconds of a step beyond its tokens.
    pub base_seconds: f64,
    /// Fitted seconds per token of a step.
    pub per_token_seconds: f64,
    /// Steps the model learned from.
    pub samples: u64,
    /// Timings rejected as outliers.
    pub rejected: u64,
    /// Times the model restarted after a run of outliers.
    pub restarts: u64,
    /// Whether the model has seen enough steps to be used.
    pub ready: bool,
}

/// The online fit of step time against step tokens.
#[derive(Debug, Clone, Default)]
pub struct StepCost {
    /// Weighted sums: weight, x, y, x*x, x*y.
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    /// Steps since the last restart.
    fresh: u32,
    /// Consecutive outliers.
    streak: u32,
    samples: u64,
    rejected: u64,
    restarts: u64,
}

impl StepCost {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Learns a step of `tokens` tokens that took `seconds`. Returns
    /// whether the timing was used (an outlier is not).
    pub fn observe(&mut self, tokens: usize, seconds: f64) -> bool {
        if tokens == 0 || !seconds.is_finite() {
            self.rejected += 1;
            return false;
        }
        let y = seconds.clamp(0.0, MAX_SECONDS);
        let x = tokens as f64;
        if let Some((base, per_token)) = self.fit() {
            let predicted = base + per_token * x;
            let outlier = y > predicted * OUTLIER_FACTOR + OUTLIER_SLACK
                || y * OUTLIER_FACTOR + OUTLIER_SLACK < predicted;
            if outlier {
                self.streak += 1;
                self.rejected += 1;
                if self.streak < RESTART_AFTER {
                    return false;
                }
                tracing::debug!(
                    seconds = y,
                    predicted,
                    "step timings moved away from the cost model: it starts over"
                );
                *self = Self {
                    samples: self.samples,
                    rejected: self.rejected,
                    restarts: self.restarts + 1,
                    ..Self::default()
                };
            }
        }
        self.streak = 0;
        self.w = self.w * DECAY + 1.0;
        self.sx = self.sx * DECAY + x;
        self.sy = self.sy * DECAY + y;
        self.sxx = self.sxx * DECAY + x * x;
        self.sxy = self.sxy * DECAY + x * y;
        self.fresh = self.fresh.saturating_add(1);
        self.samples += 1;
        true
    }

    /// `(base, per_token)` seconds once enough steps were seen. Both are
    /// non-negative; steps that all ran the same number of tokens cannot
    /// tell the two apart, and then all the time counts as base (drafting
    /// looks free, which keeps each request's own length).
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.fresh < MIN_STEPS || self.w <= 0.0 {
            return None;
        }
        let mx = self.sx / self.w;
        let my = self.sy / self.w;
        let vxx = self.sxx / self.w - mx * mx;
        let vxy = self.sxy / self.w - mx * my;
        // Token counts spread less than a tenth of a token: no slope.
        let per_token = if vxx > 0.01 {
            (vxy / vxx).max(0.0)
        } else {
            0.0
        };
        let base = my - per_token * mx;
        if base < 0.0 {
            // A line through the origin fits better than a negative base.
            let through = if self.sxx > 0.0 {
                (self.sxy / self.sxx).max(0.0)
            } else {
                0.0
            };
            return Some((0.0, through.min(MAX_SECONDS)));
        }
        Some((base.min(MAX_SECONDS), per_token.min(MAX_SECONDS)))
    }

    /// What the model holds, for metrics.
    pub fn stats(&self) -> StepCostStats {
        let fit = self.fit();
        let (base_seconds, per_token_seconds) = fit.unwrap_or((0.0, 0.0));
        StepCostStats {
            base_seconds,
            per_token_seconds,
            samples: self.samples,
            rejected: self.rejected,
            restarts: self.restarts,
            ready: fit.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(model: &mut StepCost, base: f64, per_token: f64, steps: usize) {
        for i in 0..steps {
            let tokens = 8 + (i * 7) % 25;
            model.observe(tokens, base + per_token * tokens as f64);
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 + 1e-3 * b.abs()
    }

    #[test]
    fn learns_base_and_per_token_from_steps() {
        let mut m = StepCost::new();
        assert_eq!(m.fit(), None, "no steps, no model");
        feed(&mut m, 0.010, 0.004, 7);
        assert_eq!(m.fit(), None, "too few steps");
        feed(&mut m, 0.010, 0.004, 20);
        let (base, per_token) = m.fit().expect("ready");
        assert!(
            close(base, 0.010) && close(per_token, 0.004),
            "{base} {per_token}"
        );
        assert!(m.stats().ready);
    }

    #[test]
    fn equal_steps_count_as_base_and_slopes_never_go_negative() {
        let mut m = StepCost::new();
        for _ in 0..20 {
            m.observe(8, 0.02);
        }
        let (base, per_token) = m.fit().expect("ready");
        assert!(close(base, 0.02) && per_token == 0.0);
        let mut down = StepCost::new();
        for i in 0..20 {
            let tokens = 1 + i % 10;
            down.observe(tokens, 0.05 - 0.001 * tokens as f64);
        }
        let (base, per_token) = down.fit().expect("ready");
        assert!(per_token == 0.0 && base > 0.0);
    }

    #[test]
    fn outlier_timings_are_bounded_and_the_model_recovers() {
        let mut m = StepCost::new();
        feed(&mut m, 0.010, 0.004, 40);
        let before = m.fit().expect("ready");
        // A stalled step, a clock jump backwards, a nonsense value.
        assert!(!m.observe(10, 5.0));
        assert!(!m.observe(10, 0.0));
        assert!(!m.observe(10, f64::NAN));
        assert!(!m.observe(10, f64::INFINITY));
        assert!(!m.observe(0, 0.01));
        assert_eq!(m.fit(), Some(before), "outliers change nothing");
        assert_eq!(m.stats().rejected, 5);
        // Normal steps go on being learned.
        feed(&mut m, 0.010, 0.004, 5);
        let (base, per_token) = m.fit().expect("ready");
        assert!(close(base, 0.010) && close(per_token, 0.004));

        // The machine really got 10x slower: after a run of outliers the
        // model starts over and learns the new costs.
        feed(&mut m, 0.100, 0.040, 40);
        let (base, per_token) = m.fit().expect("ready");
        assert!(
            close(base, 0.100) && close(per_token, 0.040),
            "{base} {per_token}"
        );
        assert_eq!(m.stats().restarts, 1);

        // Huge timings are clamped before they are learned.
        let mut fresh = StepCost::new();
        for _ in 0..20 {
            fresh.observe(4, 1e9);
        }
        let (base, _) = fresh.fit().expect("ready");
        assert!(base <= MAX_SECONDS);
    }
}
